"""The engines of data-parallel replicas behind one endpoint (rank 0 of a launched run): to the server, one engine
(submit, cancel, stop, busy_rows, waiting, replicas), each request sent to the replica with the least work."""
from __future__ import annotations

import threading
from typing import List


class Replicas:
    """The engines of data-parallel replicas behind one endpoint, as the app sees one engine: a request
    goes to the replica with the least work."""

    def __init__(self, engines: List):
        self.replicas = engines       # as Engine.replicas: the engines that answer
        self.session = engines[0].session
        for engine in engines:
            engine.counted = self            # the metrics' running / waiting count every replica

    @property
    def waiting(self) -> list:
        return [request for engine in self.replicas for request in engine.waiting]

    def busy_rows(self) -> int:
        return sum(engine.busy_rows() for engine in self.replicas)

    def submit(self, request) -> None:
        min(self.replicas, key=lambda e: e.busy_rows() + len(e.waiting)).submit(request)

    def cancel(self, request) -> None:
        for engine in self.replicas:           # only the one holding it has anything to free
            engine.cancel(request)

    def stop(self, timeout: float = 10.0) -> None:
        """Every replica's `Engine.stop` at once: they drain together, within one `timeout`."""
        stopping = [threading.Thread(target=engine.stop, args=(timeout,)) for engine in self.replicas]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
