"""A real `spoolmq ui` subprocess, and HTTP requests to it as a browser or an API client
makes them (urllib: no client library the console does not already need)."""

from __future__ import annotations

import http.cookiejar
import os
import re
import selectors
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

PASSWORD = "correct horse battery"


def need(program: str, package: str) -> str:
    """The program's path; skip when it is missing, but fail in CI (.ci/run installs it)."""
    found = shutil.which(program)
    if found is None:
        message = f"{program} is not installed (apt-get install {package})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: .ci/run installs it")
        pytest.skip(message)
    return found


def spoolmq(*args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolmq", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


class UIProcess:
    """`spoolmq ui --listen 127.0.0.1:0` on ``data``; ``url`` once it printed where it is."""

    def __init__(self, data: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spoolmq", "ui", "--data", str(data),
             "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        # A selector, not select.select: late in a long pytest session the pipe's descriptor
        # can be above select()'s limit of 1024.
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(60)
        line = self.process.stdout.readline() if ready else ""
        found = re.search(r"http://\S+/", line)
        if found is None:
            self.stop()
            raise AssertionError(f"the console did not start: {line!r}")
        self.url = found.group(0).rstrip("/")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # by its pid: only the process this test started
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)

    def __enter__(self) -> UIProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Client:
    """HTTP to the console: with a bearer ``token``, or as a browser with cookies."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.token = token
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirect()
        )
        self.csrf = ""

    def request(
        self, path: str, *, method: str = "GET", body: Any = None, raw: bytes | None = None,
        headers: dict[str, str] | None = None, form: dict[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:  # fmt: skip
        sent = dict(headers or {})
        if self.token is not None:
            sent.setdefault("Authorization", f"Bearer {self.token}")
        data = raw
        if body is not None:
            data = orjson.dumps(body)
            sent["Content-Type"] = "application/json"
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with self.opener.open(req, timeout=60) as response:
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, error.read(), dict(error.headers)

    def json(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        status, content, _ = self.request(path, **kwargs)
        return status, orjson.loads(content)

    def login(self, password: str = PASSWORD) -> int:
        """Log in as the form does; return the status of the answer (303: logged in)."""
        status, page, _ = self.request("/login")
        assert status == 200
        nonce = re.search(rb'name="nonce" value="([^"]+)"', page)
        assert nonce is not None
        status, _, _ = self.request(
            "/login", method="POST", form={"nonce": nonce.group(1).decode(), "password": password}
        )
        if status == 303:
            _, shell, _ = self.request("/")
            csrf = re.search(rb'data-csrf="([^"]+)"', shell)
            assert csrf is not None
            self.csrf = csrf.group(1).decode()
        return status


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the tests look at the 303 itself
