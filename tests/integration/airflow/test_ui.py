"""The "Exactly-once" page against a real ``airflow api-server`` with the plugin installed
(entry point), Airflow's SimpleAuthManager with an admin and a viewer, a SQLite ledger with
a pipeline's history and the session's Kafka broker for lag.

API tests: anonymous and forged requests are refused (Airflow does not protect a plugin's
endpoints by itself), a viewer reads but may not trigger, shapes, pagination, lag.
Browser test: headless Chromium logs in through Airflow's login page, opens the page from
the navigation, sees the pipeline and its checkpoints, clicks **Take savepoint**, and the
savepoint DAG run exists in Airflow. Screenshots: ``.eo/test-artifacts/ui/``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from eo_harness import wait_for

from airflow_provider_eo.kafka.admin import ensure_topic
from airflow_provider_eo.ledger import Actor, Ledger
from airflow_provider_eo.testing.ledger_fill import run_checkpoints

from .conftest import ROOT, VENV_BIN, airflow_base_env
from .test_scheduler import _free_port, _stop

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.timeout(300)]

PASSWORDS = {"admin": "admin-pw-eo", "viewer": "viewer-pw-eo"}
ARTIFACTS = Path(os.environ.get("EO_TEST_ARTIFACTS", ROOT / ".eo" / "test-artifacts")) / "ui"
CHECKPOINTS = 7
PER_PARTITION = 4
PRODUCED = 40  # per partition: lag = 40 - 7*4 = 12 each


@dataclass
class UiServer:
    url: str
    home: Path
    pipeline: str
    ledger_url: str

    def token(self, user: str) -> str:
        r = httpx.post(
            f"{self.url}/auth/token", json={"username": user, "password": PASSWORDS[user]}, timeout=30
        )
        r.raise_for_status()
        return str(r.json()["access_token"])

    def get(self, path: str, user: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token(user)}"} if user else {}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=30, **kwargs)

    def log(self) -> str:
        return (self.home / "api-server.log").read_text(errors="replace")[-5000:]


@pytest.fixture(scope="module")
def ui_server(
    tmp_path_factory: pytest.TempPathFactory, airflow_db_template: Path, kafka_bootstrap: str
) -> Iterator[UiServer]:
    home = tmp_path_factory.mktemp("ui-airflow")
    dags = home / "dags"
    dags.mkdir()
    shutil.copy(airflow_db_template, home / "airflow.db")
    for name in ("eo_control_dags.py", "eo_demo_pipelines.py"):
        shutil.copy(ROOT / "dags" / name, dags / name)
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    ledger_url = f"sqlite:///{home}/ledger.db"
    pipeline = f"ui-{uuid.uuid4().hex[:6]}"
    topic = f"ui-src-{uuid.uuid4().hex[:6]}"
    config = {"bootstrap.servers": kafka_bootstrap}
    ensure_topic(config, topic, partitions=2)
    producer = Producer(config)
    for partition in (0, 1):
        for i in range(PRODUCED):
            producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=partition)
    producer.flush(30)
    actor = Actor(dag_id="eo_pipeline", run_id="manual__ui", task_id="eo.plan", try_number=1)
    with Ledger(ledger_url) as ledger:
        run_checkpoints(
            ledger,
            pipeline,
            [(topic, 0), (topic, 1)],
            count=CHECKPOINTS,
            per_partition=PER_PARTITION,
            actor=actor,
        )
    port = _free_port()
    env = airflow_base_env(home, dags)
    env.update(
        {
            # As a deployment configures the page: Airflow connections named in [eo].
            "AIRFLOW__EO__LEDGER_CONN_ID": "eo_ui_ledger",
            "AIRFLOW_CONN_EO_UI_LEDGER": json.dumps(
                {"conn_type": "eo_ledger", "extra": {"sqlalchemy_url": ledger_url}}
            ),
            "AIRFLOW__EO__KAFKA_CONN_ID": "eo_ui_kafka",
            "AIRFLOW_CONN_EO_UI_KAFKA": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
            ),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        }
    )
    for fallback in ("EO_LEDGER_URL", "EO_KAFKA_BOOTSTRAP", "EO_LEDGER_CONN_ID", "EO_KAFKA_CONN_ID"):
        env.pop(fallback, None)
    subprocess.run(
        [str(VENV_BIN / "airflow"), "dags", "reserialize"],
        env=env,
        check=True,
        capture_output=True,
        timeout=180,
    )
    log = (home / "api-server.log").open("wb")
    proc = subprocess.Popen(
        [str(VENV_BIN / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = UiServer(url=f"http://127.0.0.1:{port}", home=home, pipeline=pipeline, ledger_url=ledger_url)
    try:

        def healthy() -> bool:
            assert proc.poll() is None, f"api-server exited:\n{server.log()}"
            try:
                return httpx.get(f"{server.url}/api/v2/monitor/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, "the api-server to answer /api/v2/monitor/health")
        yield server
    finally:
        _stop([proc])


def test_endpoints_refuse_anonymous_and_forged_requests(ui_server: UiServer) -> None:
    for path in (
        "/eo/api/pipelines",
        f"/eo/api/pipelines/{ui_server.pipeline}",
        f"/eo/api/pipelines/{ui_server.pipeline}/checkpoints",
        f"/eo/api/pipelines/{ui_server.pipeline}/lag",
        f"/eo/api/pipelines/{ui_server.pipeline}/savepoints",
    ):
        assert ui_server.get(path).status_code == 401, path
        forged = httpx.get(
            f"{ui_server.url}{path}", headers={"Authorization": "Bearer not.a.jwt"}, timeout=30
        )
        assert forged.status_code in (401, 403), (path, forged.status_code)
        assert ui_server.pipeline not in forged.text
        cookie = httpx.get(f"{ui_server.url}{path}", cookies={"_token": "forged"}, timeout=30)
        assert cookie.status_code in (401, 403), (path, cookie.status_code)


def test_viewer_reads_but_may_not_trigger(ui_server: UiServer) -> None:
    body = ui_server.get(f"/eo/api/pipelines/{ui_server.pipeline}", "viewer").json()
    assert body["name"] == ui_server.pipeline and body["state"] == "running"
    assert body["actions"]["can_savepoint"] is False and body["actions"]["can_control"] is False
    token = ui_server.token("viewer")
    refused = httpx.post(
        f"{ui_server.url}/api/v2/dags/eo_savepoint/dagRuns",
        json={"logical_date": None, "conf": {"pipeline": "x:y", "name": "n"}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert refused.status_code == 403
    admin = ui_server.get(f"/eo/api/pipelines/{ui_server.pipeline}", "admin").json()
    assert admin["actions"]["can_savepoint"] is True and admin["actions"]["can_control"] is True


def test_shapes_pagination_and_lag(ui_server: UiServer) -> None:
    listed = ui_server.get("/eo/api/pipelines", "admin").json()
    (p,) = [p for p in listed["pipelines"] if p["name"] == ui_server.pipeline]
    assert p["last_committed"]["checkpoint_id"] == CHECKPOINTS and p["in_flight"] is None
    assert p["dag_id"] == "eo_pipeline" and p["links"]["runs"] == "dags/eo_pipeline/runs"
    ids: list[int] = []
    params: dict[str, Any] = {"limit": 3}
    while True:
        page = ui_server.get(
            f"/eo/api/pipelines/{ui_server.pipeline}/checkpoints", "admin", params=params
        ).json()
        ids += [c["checkpoint_id"] for c in page["checkpoints"]]
        if page["next_before"] is None:
            break
        params = {"limit": 3, "before": page["next_before"]}
    assert ids == list(range(CHECKPOINTS, 0, -1))

    def lag_read() -> bool:
        return bool(
            ui_server.get(f"/eo/api/pipelines/{ui_server.pipeline}/lag", "admin").json()["state"] == "ok"
        )

    wait_for(lag_read, "the page's lag to be read from Kafka", timeout=60)
    lag = ui_server.get(f"/eo/api/pipelines/{ui_server.pipeline}/lag", "admin").json()
    expected = PRODUCED - CHECKPOINTS * PER_PARTITION
    assert [r["lag"] for r in lag["partitions"]] == [expected, expected] and lag["total"] == 2 * expected


@pytest.mark.browser
def test_browser_logs_in_sees_checkpoints_and_takes_a_savepoint(ui_server: UiServer) -> None:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_bin, (
        "install Debian's chromium and chromium-driver (scripts/bootstrap.sh does)"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("failure.*"):
        old.unlink()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_bin), options=options)
    # The page re-renders every 10 s: an element found just before may be replaced.
    wait = WebDriverWait(browser, 60, ignored_exceptions=(StaleElementReferenceException,))
    try:
        browser.get(f"{ui_server.url}/auth/login")
        wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
        browser.find_element(By.NAME, "password").send_keys(PASSWORDS["admin"])
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda b: "/auth/login" not in b.current_url)
        # The navigation's "Exactly-once" entry opens the page inside Airflow's UI.
        browser.get(f"{ui_server.url}/plugin/exactly-once")
        frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='/eo/']")))
        browser.switch_to.frame(frame)
        row = wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, f"tr[data-pipeline='{ui_server.pipeline}']"))
        )
        row.click()
        wait.until(
            ec.presence_of_element_located(
                (By.CSS_SELECTOR, f"#eo-history tr[data-checkpoint='{CHECKPOINTS}']")
            )
        )
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#eo-lag tbody tr td:last-child").text.isdigit())
        browser.switch_to.default_content()
        browser.save_screenshot(str(ARTIFACTS / "exactly-once-page.png"))
        browser.switch_to.frame(frame)
        browser.find_element(By.ID, "eo-take-savepoint").click()
        browser.find_element(By.ID, "sp-pipeline").clear()
        browser.find_element(By.ID, "sp-pipeline").send_keys("eo_demo_pipelines:demo_pipeline")
        name = browser.find_element(By.ID, "sp-name")
        name.clear()
        name.send_keys("from-the-browser")
        browser.find_element(By.ID, "sp-note").send_keys("taken by the browser test")
        browser.switch_to.default_content()
        browser.save_screenshot(str(ARTIFACTS / "take-savepoint-form.png"))
        browser.switch_to.frame(frame)
        browser.find_element(By.ID, "sp-submit").click()
        message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#eo-message[data-run-id]")))
        run_id = message.get_attribute("data-run-id")
        browser.switch_to.default_content()
        browser.save_screenshot(str(ARTIFACTS / "savepoint-triggered.png"))
        # A task's "Checkpoint" extra link opens the page at its checkpoint, highlighted.
        browser.get(f"{ui_server.url}/eo/?pipeline={ui_server.pipeline}&checkpoint=3")
        focused = wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, "#eo-history tr.selected[data-checkpoint='3']"))
        )
        assert focused.is_displayed()
        shown = [
            r.get_attribute("data-checkpoint")
            for r in browser.find_elements(By.CSS_SELECTOR, "#eo-history tbody tr")
        ]
        assert shown == ["3", "2", "1"], shown
    except Exception:
        browser.save_screenshot(str(ARTIFACTS / "failure.png"))
        (ARTIFACTS / "failure.html").write_text(browser.page_source)
        raise
    finally:
        browser.quit()
    run = ui_server.get(f"/api/v2/dags/eo_savepoint/dagRuns/{run_id}", "admin")
    assert run.status_code == 200, run.text
    assert run.json()["conf"]["name"] == "from-the-browser"
    assert run.json()["conf"]["pipeline"] == "eo_demo_pipelines:demo_pipeline"
