"""Tasks: seeded synthetic benchmarks (Zoology MQAR, long-context MQAR, MAD) and user files, all behind one contract.

``load_task("mqar:num_kv_pairs=16")`` builds one from a spec string, ``task_from_config`` rebuilds
one from the ``config`` it recorded, ``list_tasks`` names them.
"""

from nas.tasks.base import IGNORE_INDEX, MAX_SEQ_LEN, MAX_TASK_TOKENS, MAX_VOCAB, Task, TaskError
from nas.tasks.files import load_npz, load_text
from nas.tasks.mad import in_context_recall, noisy_in_context_recall, selective_copying
from nas.tasks.mqar import mqar, mqar_long
from nas.tasks.registry import list_tasks, load_task, task_file, task_from_config, task_moved

__all__ = [
    "IGNORE_INDEX",
    "MAX_SEQ_LEN",
    "MAX_TASK_TOKENS",
    "MAX_VOCAB",
    "Task",
    "TaskError",
    "in_context_recall",
    "list_tasks",
    "load_npz",
    "load_task",
    "load_text",
    "mqar",
    "mqar_long",
    "noisy_in_context_recall",
    "selective_copying",
    "task_file",
    "task_from_config",
    "task_moved",
]
