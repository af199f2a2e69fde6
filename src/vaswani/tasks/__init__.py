"""Tasks: one home for everything that differs between translation, language modelling and
classification (see ``tasks/base.py``). ``task_for(config)`` gives the task of a run."""

from __future__ import annotations

from ..config import RunConfig
from .base import Task, TaskData
from .classification import Classification
from .language_model import LanguageModelling
from .translation import Translation

TASKS: dict[str, type[Task]] = {task.arch: task for task in
                                (Translation, LanguageModelling, Classification)}


def task_for(config: RunConfig) -> Task:
    """The task served by ``config.model.arch``, built with the run's config."""
    return TASKS[config.model.arch](config)


__all__ = ["TASKS", "Classification", "LanguageModelling", "Task", "TaskData", "Translation",
           "task_for"]
