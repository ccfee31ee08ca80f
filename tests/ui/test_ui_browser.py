"""The console in a real browser (headless Chromium driven by Selenium) against a real
broker: log in, see a published message, search a key, redrive a dead letter and see it
consumed again, reset a group through its preview and confirm, and the refusals (a wrong
password, every action in read-only mode). One broker, one console, one browser for the
module: Chromium takes seconds to start on a busy machine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from ui_helpers import PASSWORD, UIProcess, need, spoolmq

from spoolmq.client import Consumer, Publisher
from spoolmq.store import Message, Store
from spoolmq.testing import BrokerProcess, wait_until

WAIT = 60  # seconds: a generous bound on a shared 2-core machine, never a sleep


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ui_browser") / "queue_data"
    root.mkdir(mode=0o700)
    result = spoolmq("ui", "--set-password", "--data", str(root), stdin=PASSWORD + "\n")
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture(scope="module")
def broker(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    log = tmp_path_factory.mktemp("ui_broker_log") / "broker.log"
    with BrokerProcess(data, log_file=log) as process:
        yield process


@pytest.fixture(scope="module")
def ui(data: Path, broker: BrokerProcess) -> Iterator[UIProcess]:
    with UIProcess(data) as process:
        yield process


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium = need("chromium", "chromium")
    chromedriver = need("chromedriver", "chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path_factory.mktemp("chromium_profile")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1300,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT).until(condition, f"waited {WAIT} s for {what}")


def text_of(driver: Any, selector: str) -> str:
    """The text of what ``selector`` finds now. A live page redraws itself every 2 s, so an
    element found may be replaced before its text is read: then look again."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        try:
            found = driver.find_elements("css selector", selector)
            return " ".join(element.text for element in found)
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} kept being redrawn while it was read")


def element(driver: Any, selector: str) -> Any:
    """The element once the page's script has drawn it (pages render after their fetch)."""
    return until(driver, lambda d: (d.find_elements("css selector", selector) or [None])[0],
                 selector)  # fmt: skip


def log_in(driver: Any, url: str, password: str = PASSWORD) -> None:
    driver.get(url + "/login")
    driver.find_element("id", "password").send_keys(password)
    driver.find_element("id", "login-button").click()


def open_page(driver: Any, url: str, path: str) -> None:
    """Go to ``path``, logging in first if the console sends us to its login page."""
    driver.get(url + path)
    if driver.current_url.endswith("/login"):
        log_in(driver, url)
        until(driver, lambda d: not d.current_url.endswith("/login"), "the login")
        driver.get(url + path)


def no_script_errors(driver: Any) -> None:
    """No script error and no failed request since the last look (the log is drained on
    each read); the refused login of the first test is expected."""
    severe = [
        e["message"] for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and not ("/login" in e["message"] and "401" in e["message"])
    ]  # fmt: skip
    assert severe == []


def test_a_wrong_password_is_refused(ui: UIProcess, browser: Any) -> None:
    log_in(browser, ui.url, "not the password at all")
    until(browser, lambda d: "Wrong password" in text_of(d, "#login-error"), "the refusal")
    assert browser.current_url.endswith("/login")
    browser.get(ui.url + "/topics")
    assert browser.current_url.endswith("/login")  # still no session


def test_log_in_and_see_a_published_message(ui: UIProcess, browser: Any, data: Path) -> None:
    with Publisher(data=data) as publisher:
        publisher.publish("orders", {"greeting": "hello from the test"}, key="order-42")
        for n in range(19):
            publisher.publish("orders", {"n": n}, key=f"other-{n}")
    log_in(browser, ui.url)
    until(browser, lambda d: "broker running" in text_of(d, "#broker-state"), "the overview")
    stored = "#cards .card:nth-child(2) .v"  # "Messages stored"
    until(browser, lambda d: text_of(d, stored) == "20", "the stored count")
    with Publisher(data=data) as publisher:  # the page updates itself (server-sent events)
        publisher.publish("orders", {"n": 20}, key="other-20")
    until(browser, lambda d: text_of(d, stored) == "21", "the live update, without reload")
    open_page(browser, ui.url, "/topics/orders")
    until(browser, lambda d: "order-42" in text_of(d, "#messages"), "the message")
    assert "hello from the test" in text_of(browser, "#messages")
    no_script_errors(browser)


def test_stored_markup_is_shown_as_text(ui: UIProcess, browser: Any, data: Path) -> None:
    markup = '<img id="injected" src="x" onerror="document.title=1">'
    with Publisher(data=data) as publisher:
        publisher.publish("orders", markup, key=markup, headers={"h": markup})
    open_page(browser, ui.url, "/topics/orders")
    until(browser, lambda d: markup in text_of(d, "#messages"), "the value as text")
    assert browser.find_elements("id", "injected") == []
    assert browser.title == "spoolmq console"


def test_search_a_key_and_find_it(ui: UIProcess, browser: Any) -> None:
    open_page(browser, ui.url, "/topics/orders")
    element(browser, "#search-key").send_keys("order-42")
    browser.find_element("id", "search-button").click()
    until(browser, lambda d: "1 match(es) in 22" in text_of(d, "#search-info"), "the search")
    rows = browser.find_elements("css selector", "#search-results tr.message")
    assert len(rows) == 1 and "hello from the test" in rows[0].text
    no_script_errors(browser)


def test_search_from_a_time_finds_only_what_came_after(
    ui: UIProcess, browser: Any, data: Path
) -> None:
    """The search form's time field (the README: a search runs "from an offset or a
    time"): two messages, then a time after them, then one more, all with one key."""
    import datetime
    import time

    with Publisher(data=data) as publisher:
        before = [publisher.publish("orders", {"when": "before"}, key="timed") for _ in range(2)]
        last = max(p.timestamp for p in before)
        wait_until(lambda: time.time() * 1000 > last + 5, WAIT, "the clock past them")
        publisher.publish("orders", {"when": "after"}, key="timed")
    since = datetime.datetime.fromtimestamp((last + 1) / 1000, datetime.UTC)
    open_page(browser, ui.url, "/topics/orders")
    element(browser, "#search-key").send_keys("timed")
    element(browser, "#search-time").send_keys(since.isoformat(timespec="milliseconds"))
    browser.find_element("id", "search-button").click()
    until(browser, lambda d: "1 match(es)" in text_of(d, "#search-info"), "the search")
    rows = browser.find_elements("css selector", "#search-results tr.message")
    assert len(rows) == 1 and "after" in rows[0].text
    no_script_errors(browser)


def test_redrive_a_dead_letter_and_see_it_consumed(ui: UIProcess, browser: Any, data: Path) -> None:
    with Publisher(data=data) as publisher:
        publisher.publish("jobs", {"job": "flaky"}, key="job-1")
    with Consumer("jobs", "workers", data=data, max_deliveries=1) as consumer:
        first = consumer.receive(timeout=WAIT)
        assert first is not None and first.value == {"job": "flaky"}
        first.nack(reason="flaky failed")  # one delivery allowed: it goes to jobs.dlq
        # The broker writes the dead letter after answering the NACK; the page shows what
        # is there when it loads, so open it once the letter is stored.
        wait_until(lambda: _dead_letters(data, "jobs"), WAIT, "the dead letter in jobs.dlq")
        open_page(browser, ui.url, "/dlq/jobs")
        until(browser, lambda d: "flaky failed" in text_of(d, "#dead-letters"), "the letter")
        assert "1 dead letter(s)" in text_of(browser, "#dlq-info")
        element(browser, "#dead-letters input.pick").click()
        element(browser, "#redrive-selected").click()
        until(browser, lambda d: "Redriven: 1" in text_of(d, "#dlq-result"), "the redrive")
        again = consumer.receive(timeout=WAIT)
        assert again is not None and again.value == {"job": "flaky"} and again.offset == 1
        again.ack()
    no_script_errors(browser)


def test_purge_the_dead_letters_a_filter_shows_with_the_confirm(
    ui: UIProcess, browser: Any, data: Path
) -> None:
    """The Purge button: after the browser's confirm, the letters the page's filter shows
    are purged (the others stay), and the list shows what is left."""
    with Store(data) as store:
        store.append_batch(
            "purgeable.dlq",
            [
                Message(value={"n": n}, key=f"k{n % 2}", headers={"x-dlq-reason": f"r{n}"})
                for n in range(4)
            ],
        )
    open_page(browser, ui.url, "/dlq/purgeable")
    until(browser, lambda d: "4 dead letter(s)" in text_of(d, "#dlq-info"), "the letters")
    element(browser, "#dlq-filter input[name=key]").send_keys("k1")
    element(browser, "#dlq-filter button").click()
    until(browser, lambda d: "2 dead letter(s)" in text_of(d, "#dlq-info"), "the filter")
    element(browser, "#purge").click()
    alert = browser.switch_to.alert
    assert "the filter shows" in alert.text
    alert.accept()
    until(browser, lambda d: "Purged: 2" in text_of(d, "#dlq-result"), "the purge")
    listed = spoolmq("dlq", "list", "purgeable", "--json", "--data", str(data))
    assert [d["key"] for d in orjson.loads(listed.stdout)] == ["k0", "k0"]
    no_script_errors(browser)


def test_a_page_whose_login_ends_says_so_instead_of_failing(ui: UIProcess, browser: Any) -> None:
    """The pages' live views end with an ``{"error"}`` event when their login is gone (here
    the browser's session logged out by another client): the page shows it, where its
    script used to fail on it (an uncaught TypeError)."""
    import urllib.parse
    import urllib.request

    open_page(browser, ui.url, "/pending")
    until(browser, lambda d: "In flight" in text_of(d, "#pending"), "the page")
    no_script_errors(browser)
    session = browser.get_cookie("spoolmq_session")["value"]
    csrf = browser.execute_script("return document.body.dataset.csrf")
    request = urllib.request.Request(
        ui.url + "/logout",
        data=urllib.parse.urlencode({"csrf": csrf}).encode(),
        headers={"Cookie": f"spoolmq_session={session}"},
    )
    with urllib.request.urlopen(request, timeout=WAIT):  # follows the redirect to /login
        pass
    until(browser, lambda d: text_of(d, "#error") != "", "the error shown")
    uncaught = [e["message"] for e in browser.get_log("browser") if "Uncaught" in e["message"]]
    assert uncaught == []


def test_reset_a_group_with_the_confirm(ui: UIProcess, browser: Any, data: Path) -> None:
    with Consumer("orders", "billing", data=data) as consumer:
        for _ in range(22):
            message = consumer.receive(timeout=WAIT)
            assert message is not None
            message.ack()
    open_page(browser, ui.url, "/groups")
    billing = '[data-group="billing"]'
    until(browser, lambda d: "22" in text_of(d, f"{billing} td.committed"), "the committed 22")
    from selenium.webdriver.support.ui import Select

    Select(
        browser.find_element("css selector", f"{billing} select[name=topic]")
    ).select_by_visible_text("orders")
    browser.find_element("css selector", f"{billing} form.reset button").click()
    until(browser, lambda d: "Preview" in text_of(d, f"{billing} .preview"), "the preview")
    assert "22" in text_of(browser, f"{billing} .preview")  # from 22 ...
    assert text_of(browser, f"{billing} td.committed") == "22"  # ... and nothing changed yet
    element(browser, f"{billing} .confirm-reset").click()
    until(browser, lambda d: "done" in text_of(d, "#group-notice"), "the reset")
    until(browser, lambda d: text_of(d, f"{billing} td.committed") == "0", "the committed 0")
    no_script_errors(browser)


def test_read_only_hides_and_refuses_actions(
    data: Path, broker: BrokerProcess, browser: Any
) -> None:
    """Its own topics and group (not the other tests'), so it holds when run alone."""
    with Publisher(data=data) as publisher:
        for n in range(3):
            publisher.publish("audit", {"n": n})
        publisher.publish("audit-jobs", {"job": "bad"})
    with Consumer("audit", "auditors", data=data) as consumer:
        for _ in range(3):
            message = consumer.receive(timeout=WAIT)
            assert message is not None
            message.ack()
    with Consumer("audit-jobs", "audit-workers", data=data, max_deliveries=1) as consumer:
        message = consumer.receive(timeout=WAIT)
        assert message is not None
        message.nack(reason="bad job")
        wait_until(lambda: _dead_letters(data, "audit-jobs"), WAIT, "the dead letter")
    wait_until(lambda: _committed(data, "auditors", "audit") == 3, WAIT, "the 3 ACKs committed")
    with UIProcess(data, "--read-only") as ui:
        # localhost, not 127.0.0.1: its own cookies, so the other console's session stays.
        url = ui.url.replace("127.0.0.1", "localhost")
        open_page(browser, url, "/dlq/audit-jobs")
        until(browser, lambda d: "bad job" in text_of(d, "#dead-letters"), "the letter")
        assert "1 dead letter(s)" in text_of(browser, "#dlq-info")
        assert "read-only" in text_of(browser, "#mode")
        assert browser.find_elements("id", "redrive-all") == []
        assert browser.find_elements("id", "purge") == []
        assert browser.find_elements("css selector", "#dead-letters input.pick") == []
        open_page(browser, url, "/groups")
        until(browser, lambda d: "auditors" in text_of(d, "#groups"), "the groups page")
        assert browser.find_elements("css selector", "form.reset") == []
        status = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/api/groups/auditors/reset', {method: 'POST', headers: {'Content-Type':"
            " 'application/json', 'X-CSRF-Token': document.body.dataset.csrf}, body:"
            " JSON.stringify({topic: 'audit', to: 'earliest', execute: true})})"
            ".then(r => r.json().then(j => done([r.status, j.error])));"
        )
        assert status[0] == 403 and "read-only" in status[1]
        browser.get("about:blank")  # leave before this console stops: no live stream retrying
        browser.get_log("browser")  # drop the 403 just provoked: it was the point
    assert _committed(data, "auditors", "audit") == 3  # the refused reset changed nothing
    assert _dead_letters(data, "audit-jobs") == 1


def _committed(data: Path, group: str, topic: str) -> int | None:
    from spoolmq.operations import group_rows

    rows = group_rows(data).get(group, [])
    found = [row["committed"] for row in rows if row["topic"] == topic]
    return int(found[0]) if found and found[0] is not None else None


def test_metrics_of_the_running_broker(ui: UIProcess, data: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families
    from ui_helpers import Client

    token = spoolmq("ui", "token", "create", "prometheus", "--data", str(data)).stdout.split()[-1]
    status, content, _ = Client(ui.url, token).request("/metrics")
    assert status == 200
    names = {
        (s.name, s.labels.get("topic")): s.value
        for family in text_string_to_metric_families(content.decode())
        for s in family.samples
    }
    assert names[("spoolmq_broker_up", None)] == 1
    assert names[("spoolmq_messages_published_total", "orders")] >= 20


def test_the_groups_page_shows_each_member(ui: UIProcess, browser: Any, data: Path) -> None:
    with Consumer("orders", "watchers", data=data, start="latest", name="watcher-1") as consumer:
        consumer.receive(timeout=0.1)  # joined: the broker knows it now
        open_page(browser, ui.url, "/groups")
        watchers = '[data-group="watchers"] .member'
        until(browser, lambda d: f"pid {os.getpid()}" in text_of(d, watchers), "the member")
        assert "watcher-1" in text_of(browser, watchers)
    # The broker writes a lag snapshot to events/ every 5 s; the chart reads them back.
    until(browser, lambda d: d.find_elements("css selector", "#lag-chart polyline"), "lag chart")
    assert text_of(browser, "#lag-chart .legend").strip()  # one line per group
    no_script_errors(browser)


def test_the_groups_page_counts_parked_messages(ui: UIProcess, browser: Any, data: Path) -> None:
    """Messages due an hour later are parked in state.db, past the committed offset: the
    page counts them, where the lag says 0."""
    with Publisher(data=data) as publisher:
        for n in range(2):
            publisher.publish("later", n, delay=3600)
    with Consumer("later", "reports", data=data) as consumer:
        assert consumer.receive(timeout=0.5) is None  # joined: the broker reads them now
        wait_until(lambda: _parked(data, "reports") == 2, WAIT, "the messages to be parked")
    open_page(browser, ui.url, "/groups")
    reports = '[data-group="reports"]'
    until(browser, lambda d: text_of(d, f"{reports} td.parked") == "2", "the parked count")
    assert "parked 2" in text_of(browser, f"{reports} h2")
    assert text_of(browser, f"{reports} td.lag") == "0"
    no_script_errors(browser)


def _parked(data: Path, group: str) -> int:
    from spoolmq.operations import group_rows

    return sum(row["parked"] for row in group_rows(data).get(group, []))


def _dead_letters(data: Path, topic: str) -> int:
    from spoolmq.operations import dead_letters
    from spoolmq.store import Store

    with Store(data) as store:
        return len(dead_letters(store, topic))
