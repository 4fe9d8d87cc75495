"""`InferTask`: task name -> inference class, as upstream MindFormers exposed it."""
from __future__ import annotations

from typing import Dict, List, Type

from lite_runtime.contract.errors import ConfigError, UnsupportedError
from lite_runtime.api.infer_config import InferConfig
from lite_runtime.api.text_generator import TextGeneratorInfer


class InferTask:
    task_mapping: Dict[str, Type] = {"text_generation": TextGeneratorInfer}

    @classmethod
    def support_list(cls) -> List[str]:
        return sorted(cls.task_mapping)

    @classmethod
    def check_task_valid(cls, task_type: str) -> bool:
        return task_type in cls.task_mapping

    @classmethod
    def get_infer_task(cls, task_type: str, task_config: InferConfig, **kwargs):
        """Build the task's inference object; kwargs go to it (e.g. tokenizer=...)."""
        if not cls.check_task_valid(task_type):
            raise UnsupportedError(f"unknown task {task_type!r}; supported: {', '.join(cls.support_list())}")
        if not isinstance(task_config, InferConfig):
            raise ConfigError(f"task_config must be an InferConfig, got {type(task_config).__name__}")
        return cls.task_mapping[task_type](task_config, **kwargs)
