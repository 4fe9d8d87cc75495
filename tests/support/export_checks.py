"""What a failed or interrupted export must not leave behind."""
import os


def assert_nothing_left(output_dir):
    """No output folder and no temporary export folder beside where it would have been."""
    assert not os.path.exists(output_dir), f"{output_dir} was left behind: {os.listdir(output_dir)}"
    parent = os.path.dirname(output_dir)
    if os.path.isdir(parent):
        leftovers = [n for n in os.listdir(parent) if n.startswith(".export-") or ".old-" in n]
        assert not leftovers, f"temporary folders left in {parent}: {leftovers}"
