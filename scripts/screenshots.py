"""Screenshots of the web console for the README, taken from a demo store.

    uv run python scripts/screenshots.py              # writes docs/images/console-*.png

It builds a small store in a temporary directory (orders with keys, headers, tags and a
raw-bytes message; a group that keeps up and one that lags; dead letters from a flaky
worker), starts a real broker and `spoolmq ui` on it, logs in with headless Chromium
and saves the overview, the message browser (after a search) and the DLQ page. Every
process it starts is stopped (by pid) before it exits; the directory is deleted.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from spoolmq.client import Consumer, Publisher
from spoolmq.testing import BrokerProcess

PASSWORD = "screenshots only"
OUT = Path(__file__).resolve().parent.parent / "docs" / "images"
WAIT = 60


def build_demo(data: Path) -> None:
    """Orders for two groups and a few dead letters of a flaky job worker."""
    with Publisher(data=data) as publisher:
        for n in range(240):
            publisher.publish_async(
                "orders",
                {"order_id": 1000 + n, "customer": {"id": n % 17, "vip": n % 9 == 0},
                 "amount": round(5 + (n * 7.31) % 120, 2), "items": n % 4 + 1},
                key=f"customer-{n % 17}",
                headers={"trace": f"t-{n:05d}", "source": "web" if n % 3 else "api"},
                tags=["vip"] if n % 9 == 0 else None,
            )  # fmt: skip
        publisher.publish("orders", b"\x89PNG\r\n\x1a\n\x00raw", key=b"\x00\x01")
        for n in range(12):
            publisher.publish_async(
                "jobs", {"job": "resize", "image": f"img-{n}.jpg"}, key=f"img-{n}"
            )
        publisher.flush()
    with Consumer("orders", "billing", data=data, prefetch=50) as consumer:
        for _ in range(200):
            message = consumer.receive(timeout=WAIT)
            if message is None:
                break
            message.ack()
    with Consumer("orders", "audit", data=data, prefetch=10) as consumer:
        for _ in range(60):
            message = consumer.receive(timeout=WAIT)
            if message is None:
                break
            message.ack()
    with Consumer("jobs", "workers", data=data, max_deliveries=1) as consumer:
        for n in range(12):
            message = consumer.receive(timeout=WAIT)
            if message is None:
                break
            if n % 3 == 0:
                message.nack(reason=f"PIL.UnidentifiedImageError: cannot identify img-{n}.jpg")
            else:
                message.ack()


def traffic(data: Path, stop: threading.Event) -> None:
    """A trickle of orders and their consumption while the shots are taken, so the
    overview shows live rates rather than zeros."""
    with Publisher(data=data) as publisher, Consumer("orders", "billing", data=data) as consumer:
        n = 0
        while not stop.is_set():
            publisher.publish(
                "orders", {"order_id": 5000 + n, "amount": 9.5}, key=f"customer-{n % 17}"
            )
            message = consumer.receive(timeout=1)
            if message is not None:
                message.ack()
            n += 1
            stop.wait(0.02)


def shoot(url: str, profile: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1280,900", "--hide-scrollbars",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)

    def until(condition: Any) -> None:
        WebDriverWait(driver, WAIT).until(condition)

    try:
        driver.get(url + "/login")
        driver.find_element("id", "password").send_keys(PASSWORD)
        driver.find_element("id", "login-button").click()
        until(lambda d: "broker running" in d.find_element("id", "broker-state").text)
        until(lambda d: d.find_elements("css selector", "#chart svg"))
        until(
            lambda d: any(
                td.text not in ("", "0.0")
                for td in d.find_elements("css selector", "#rates td[data-rate=published]")
            )
        )
        save(driver, "console-overview.png")

        driver.get(url + "/topics/orders")
        until(lambda d: d.find_elements("css selector", "#messages tr.message"))
        size = driver.find_element("css selector", "#seek input[name=limit]")
        size.clear()
        size.send_keys("6")
        driver.find_element("id", "seek-button").click()
        until(lambda d: len(d.find_elements("css selector", "#messages tr.message")) == 6)
        driver.find_element("id", "search-key").send_keys("customer-9")
        driver.find_element("id", "search-button").click()
        until(lambda d: "match(es)" in d.find_element("id", "search-info").text)
        driver.execute_script("window.scrollTo(0, 0)")
        save(driver, "console-messages.png")

        driver.get(url + "/dlq/jobs")
        until(lambda d: d.find_elements("css selector", "#dead-letters tr.letter"))
        save(driver, "console-dlq.png")
    finally:
        driver.quit()


def save(driver: Any, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(OUT / name))
    print(f"wrote {OUT / name}")


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory(prefix="spoolmq-shots-") as tmp:
        data = Path(tmp) / "queue_data"
        with BrokerProcess(data, log_file=Path(tmp) / "broker.log"):
            build_demo(data)
            command = [sys.executable, "-m", "spoolmq", "ui", "--data", str(data)]
            subprocess.run([*command, "--set-password"], input=PASSWORD, text=True, check=True)
            ui = subprocess.Popen(
                [*command, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True
            )
            try:
                assert ui.stdout is not None
                found = re.search(r"http://\S+/", ui.stdout.readline())
                if found is None:
                    raise SystemExit("the console did not start")
                stop = threading.Event()
                trickle = threading.Thread(target=traffic, args=(data, stop))
                trickle.start()
                try:
                    shoot(found.group(0).rstrip("/"), Path(tmp) / "profile")
                finally:
                    stop.set()
                    trickle.join()
            finally:
                ui.terminate()
                ui.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
