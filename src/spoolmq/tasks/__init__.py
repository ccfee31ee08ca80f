"""The task layer: functions declared as tasks, run by ``spoolmq worker``, with results.

Built on the public client API only (``Publisher``/``Consumer``): the broker's leases,
retries, delays, per-key order and dead letters are the tasks' too.
"""

from spoolmq.errors import ResultTimeoutError, TaskFailed
from spoolmq.tasks.app import Task, TaskHandle, Tasks
from spoolmq.tasks.schedule import Periodic

__all__ = ["Periodic", "ResultTimeoutError", "Task", "TaskFailed", "TaskHandle", "Tasks"]
