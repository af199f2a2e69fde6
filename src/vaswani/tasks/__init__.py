"""Tasks: one home per task for everything that differs in its data and training (see
``base.py``). ``task_for(config)`` gives the task of a run.

A task registers itself when its module is imported, and every module in this folder is
imported here, so adding a task is adding one file.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Batch, Task, TaskData, task_for

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

from .classification import Classification  # noqa: E402  (imported above; named for the API)
from .language_model import LanguageModelling  # noqa: E402
from .translation import Translation  # noqa: E402

__all__ = ["Batch", "Classification", "LanguageModelling", "Task", "TaskData", "Translation",
           "task_for"]
