"""Headless Chromium for the end-to-end tests: Debian's chromium and chromium-driver, driven by
selenium (`make browser-deps` installs them; `make test` requires them).

Every page the browser opens is watched from before its first script runs: the violations of
its Content-Security-Policy and the dialogs (alert, confirm, prompt) it opens are kept in the
page (`page_report` reads them)."""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The console's row and user fixtures, for the browser tests that act on failed rows as an
# operator: the same rows the console's own tests make.
from tests.console.conftest import (  # noqa: F401 (fixtures: pytest finds them by name)
    failed_events,
    make_event,
    make_message,
    make_user,
    operator,
)

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# Skipped only outside `make test`, which installs the browser and sets the variable.
needs_browser = pytest.mark.skipif(
    not Path(CHROMEDRIVER).exists() and not os.environ.get("E2E_BROWSER_REQUIRED"),
    reason="needs Debian's chromium and chromium-driver: make browser-deps",
)

# Evaluated in every new document before any of its own scripts (Chrome DevTools'
# Page.addScriptToEvaluateOnNewDocument): a violation of the policy fires
# `securitypolicyviolation` at the document, blocked inline code included.
WATCH_PAGE_SCRIPT = """
(() => {
    const violations = [];
    const dialogs = [];
    Object.defineProperty(window, "__consoleCspViolations", {value: violations});
    Object.defineProperty(window, "__consoleDialogs", {value: dialogs});
    document.addEventListener("securitypolicyviolation", (event) => {
        violations.push({
            directive: event.effectiveDirective,
            blocked: event.blockedURI,
            source: event.sourceFile,
            line: event.lineNumber,
            disposition: event.disposition,
        });
    });
    for (const name of ["alert", "confirm", "prompt"]) {
        const original = window[name];
        window[name] = function (...args) {
            dialogs.push(`${name}: ${args[0]}`);
            return original.apply(this, args);
        };
    }
})();
"""

# Resolves after the page's load event and two more turns of its event loop: violations are
# reported by a task queued after the code that caused them.
SETTLE_SCRIPT = """
const done = arguments[arguments.length - 1];
const settle = () => setTimeout(() => requestAnimationFrame(() => setTimeout(done, 50)), 50);
if (document.readyState === "complete") { settle(); } else { addEventListener("load", settle); }
"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1440,1800",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    # The console's messages (a blocked resource is also logged there), for page_report.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(10)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_PAGE_SCRIPT})
    yield driver
    driver.quit()


def wait_until_replaced(browser: Any, element: Any, timeout: float) -> None:
    """Waits until the page `element` is on has been replaced by the next one (Selenium's
    staleness_of, which takes only a stale element for an answer)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def replaced(_: Any) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            # Chromium's answer, now and then, for an element whose document is being replaced.
            if "does not belong to the document" in str(error):
                return True
            raise
        return False

    WebDriverWait(browser, timeout).until(replaced)


def log_in(browser: Any, base_url: str, username: str, password: str) -> None:
    """Logs in through the login page, and waits until the page it leads to is loaded."""
    from selenium.webdriver.common.by import By

    browser.get(f"{base_url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys(password)
    login = browser.find_element(By.CSS_SELECTOR, "button[type=submit], input[type=submit]")
    login.click()
    # The next page load must not cut the login's own (a POST, then a redirect) short.
    wait_until_replaced(browser, login, 10)


def page_report(browser: Any) -> dict[str, list[Any]]:
    """What the page now shown did that it must not: violations of its Content-Security-Policy
    (from the page's listener and from the browser's console, which also reports those of
    documents the listener did not see), dialogs it opened, and errors of its scripts. Reading
    the console empties it."""
    browser.set_script_timeout(10)
    browser.execute_async_script(SETTLE_SCRIPT)
    violations = browser.execute_script("return window.__consoleCspViolations || null")
    dialogs = browser.execute_script("return window.__consoleDialogs || null")
    console = browser.get_log("browser")
    return {
        # None: the watch script did not run in this page, which the caller must not accept.
        "violations": violations,
        "dialogs": dialogs,
        "console_csp": [
            entry["message"] for entry in console if "Content Security Policy" in entry["message"]
        ],
        "script_errors": [
            entry["message"]
            for entry in console
            if entry["level"] == "SEVERE" and "Content Security Policy" not in entry["message"]
        ],
    }


def assert_no_violations(report: dict[str, Any], page: str) -> None:
    """The page of `report` (page_report) broke no rule of its policy, opened no dialog and
    ran no script into an error."""
    assert report["violations"] == [], (page, report)
    assert report["console_csp"] == [], (page, report)
    assert report["dialogs"] == [], (page, report)
    # A browser's own request for /favicon.ico may fail; a script of the page may not.
    errors = [error for error in report["script_errors"] if "/favicon.ico" not in error]
    assert errors == [], (page, report)
