"""The web console (``spoolmq ui``): a Starlette application over the data directory.

It reads the files through the store and :mod:`spoolmq.operations` (so it works with no
broker running), and asks the running broker over the admin connection when there is one.
See the README's "Web console" section for the pages and the JSON API.
"""

from spoolmq.ui.app import create_app

__all__ = ["create_app"]
