"""The page in a real headless Chromium (Debian's chromium and chromium-driver, driven with
selenium) against a real server: translate a sentence, open the attention explorer, pick a
head, take a screenshot; the page asks nothing of any other host. Also the standalone
explorer file that ``vaswani attention --out FILE.html`` writes.

Set VASWANI_SCREENSHOT=docs/serve-page.png to keep the screenshot (the README's)."""

import json
import os
import shutil

import pytest

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a test dependency")
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="no Chromium here: `apt-get install chromium chromium-driver` (.ci/run does) to run "
           "the browser tests")


@pytest.fixture()
def browser(tmp_path):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for (Chrome's network log), less the browser's own pages
    (``chrome://`` and ``about:``), which never leave the machine."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(("chrome://", "chrome-untrusted://", "about:")):
                urls.append(url)
    return urls


def wait(driver, condition, seconds=60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds).until(condition)


@needs_chromium
def test_translate_and_explore_attention_in_a_browser(live, served, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(live.url + "/")
    wait(browser, lambda d: len(Select(d.find_element(By.ID, "model")).options) == 5)
    Select(browser.find_element(By.ID, "model")).select_by_value("copy")
    box = browser.find_element(By.ID, "input")
    box.send_keys("abcdefghij")
    browser.find_element(By.ID, "go").click()
    result = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#output .result"))
    expected = served["copy"].translate(["abcdefghij"], beam=4)[0]
    assert result[0].text.startswith(expected)
    browser.find_element(By.ID, "explore").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#viz svg line"))
    kinds = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "kind")).options]
    assert kinds == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    Select(browser.find_element(By.ID, "head")).select_by_value("1")
    first = browser.find_elements(By.CSS_SELECTOR, "#viz svg text")[0]
    first.click()  # pin a query token: its lines stay lit
    assert "active" in first.get_attribute("class")
    probabilities = browser.find_elements(By.CSS_SELECTOR, "#probabilities .prob")
    assert len(probabilities) == len(expected) + 1  # each output token and <eos>
    Select(browser.find_element(By.ID, "view")).select_by_value("heatmap")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#viz svg rect"))
    Select(browser.find_element(By.ID, "view")).select_by_value("lines")
    shot = tmp_path / "page.png"
    browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("VASWANI_SCREENSHOT"):
        shutil.copy(shot, os.environ["VASWANI_SCREENSHOT"])
    urls = requested_urls(browser)
    assert urls and all(u.startswith(live.url) or u.startswith("data:") for u in urls), urls


@needs_chromium
def test_the_standalone_explorer_file_works_offline(served, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from vaswani.cli import main

    out = tmp_path / "attention.html"
    assert main(["attention", str(served["lm"].run_dir), "--text", "to be or not",
                 "--out", str(out)]) == 0
    html = out.read_text()
    assert "window.VASWANI_DATA" in html and 'src="http' not in html and "href=\"http" not in html
    browser.get(out.as_uri())
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#viz svg line"))
    assert not browser.find_element(By.ID, "use").is_displayed()
    Select(browser.find_element(By.ID, "layer")).select_by_value("0")
    texts = [t.get_attribute("textContent")
             for t in browser.find_elements(By.CSS_SELECTOR, "#viz svg text")]
    tokens = [served["lm"].source_tokenizer.token(i) for i in
              served["lm"].source_tokenizer.encode("to be or not")]
    assert texts == tokens + tokens  # queries and keys
    urls = requested_urls(browser)
    assert all(u.startswith("file://") or u.startswith("data:") for u in urls), urls


@needs_chromium
def test_a_text_that_looks_like_html_stays_data_in_the_standalone_file(served, browser,
                                                                      tmp_path):
    """"<!--<script>" or "</script>" in the text once ended or commented out the page's
    inline JSON: every <, > and & is escaped, and the tokens show as written."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from vaswani.cli import main

    text = "a <!--<script> b </script> & c"
    out = tmp_path / "attention.html"
    assert main(["attention", str(served["lm"].run_dir), "--text", text, "--out",
                 str(out)]) == 0
    data = out.read_text().split("window.VASWANI_DATA = ", 1)[1].split(";</script>", 1)[0]
    assert not {"<", ">", "&"} & set(data)
    browser.get(out.as_uri())
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#viz svg line"))
    Select(browser.find_element(By.ID, "layer")).select_by_value("0")
    shown = [t.get_attribute("textContent")
             for t in browser.find_elements(By.CSS_SELECTOR, "#viz svg text")]
    tok = served["lm"].source_tokenizer
    assert shown[:len(tok.encode(text))] == [tok.token(i) for i in tok.encode(text)]
    assert browser.execute_script("return window.VASWANI_DATA.title") is not None


def test_the_standalone_file_holds_the_models_weights(served, tmp_path):
    """Without a browser: the embedded data are the model's attention weights (rows sum to 1,
    the future masked out)."""
    import torch

    from vaswani.serve import standalone_explorer

    view = served["copy"].attention_view("abcdefg")
    html = standalone_explorer(view, "t")
    data = json.loads(html.split("window.VASWANI_DATA = ", 1)[1].split(";</script>", 1)[0])
    maps = served["copy"].attention("abcdefg", data["target"])
    for kind, a in data["attention"].items():
        w = torch.tensor(a["weights"])
        assert torch.allclose(w, maps[kind]["weights"], atol=6e-5)
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-3)
    assert torch.all(torch.tensor(data["attention"]["decoder self-attention"]["weights"])
                     .triu(1) == 0)
