"""The web page at / in a real browser: Debian's chromium, headless, driven by chromedriver (selenium)."""

from __future__ import annotations

import os
import tempfile

import pytest
from _serve_helpers import chromium_binaries, serve

from nmt.eval import Translator

BINARIES = chromium_binaries()
# CI installs chromium (.ci/run): there a missing browser is a failure, not a skip.
pytestmark = pytest.mark.skipif(
    BINARIES is None and not os.environ.get("CI"),
    reason="needs Debian's chromium and chromium-driver (apt-get install)",
)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert BINARIES is not None, (
        "chromium or chromedriver missing: apt-get install chromium chromium-driver"
    )
    chromium, driver_path = BINARIES
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    with tempfile.TemporaryDirectory(prefix="nmt-chromium-") as profile:
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def test_type_a_sentence_press_translate_read_the_result(tiny, tmp_path, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    sentences = tiny.test_src[:2]
    expected = Translator.from_checkpoint(tiny.checkpoint).translate(sentences, beam=5)
    with serve(tiny.checkpoint, log_dir=tmp_path) as running:
        browser.get(running.url + "/")
        assert "en → de" in browser.title
        browser.find_element(By.ID, "source").send_keys("\n".join(sentences))
        browser.find_element(By.ID, "translate").click()
        result = browser.find_element(By.ID, "result")
        WebDriverWait(browser, 60).until(lambda _: result.text.strip())
        assert result.text.split("\n") == expected
        assert browser.find_element(By.ID, "status").text == ""
        # An error from the service shows on the page, and the page keeps working.
        # the selectors hold the service's direction (from GET /languages)
        assert browser.find_element(By.ID, "from").get_attribute("value") == "en"
        assert browser.find_element(By.ID, "to").get_attribute("value") == "de"
        browser.execute_script(
            "document.getElementById('to').add(new Option('fr', 'fr', true, true))"
        )
        browser.find_element(By.ID, "translate").click()
        status = browser.find_element(By.ID, "status")
        WebDriverWait(browser, 60).until(lambda _: status.text.startswith("error:"))
        assert "direction en-fr: not in the model (it has en-de)" in status.text
