"""A local SparkSession set up for gazette, with the pitfalls of PySpark handled.

Invariants:

* Workers run this interpreter (``PYSPARK_PYTHON``) and can import gazette and the caller's
  working directory (``PYTHONPATH``), so the data source and user modules unpickle there.
* Spark binds to loopback (``SPARK_LOCAL_IP``) unless told otherwise, keeps its warehouse and
  Ivy cache under a scratch directory rather than the working directory, and never resolves
  packages from the network (there are none to fetch: gazette needs only bundled jars).
* Java is checked before the JVM is launched: a missing one is a SetupError saying what to
  install, not a Py4J stack trace.
* While the session lives, :class:`Progress` can report each running stage's tasks done and
  an estimate of the time remaining.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from gazette.spark.errors import SetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Progress", "check_java", "local_session", "register"]

log = logging.getLogger(__name__)


def check_java() -> str:
    """The ``java`` executable Spark will run; SetupError when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home!r} has no bin/java" if home else "no java on PATH"
        raise SetupError(f"Spark needs Java 17 or newer ({where}): install a JRE "
                         "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SetupError(f"cannot run {java} -version: {err}") from None
    if out.returncode != 0:
        raise SetupError(f"{java} -version failed: {out.stderr.strip()}")
    return java


def _prepare_environment() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import gazette

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(gazette.__file__))), os.getcwd()]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*current, *roots]))
    # pyspark warns about pandas and pyarrow versions at import in every worker.
    warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")


def register(spark: SparkSession) -> None:
    """Make ``format("gazette")`` available in ``spark`` (also automatic where the
    ``pyspark_gazette`` module is installed, as it is with gazette)."""
    from gazette.spark.source import GazetteDataSource

    spark.dataSource.register(GazetteDataSource)


def local_session(app_name: str = "gazette", *, cores: int | str = "*",
                  driver_memory: str = "2g", scratch: str | None = None,
                  conf: dict[str, str] | None = None) -> SparkSession:
    """A local SparkSession (``local[cores]``) with format("gazette") registered."""
    check_java()
    _prepare_environment()
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise SetupError(f"PySpark is not installed ({err}): pip install 'gazette[spark]'") from None
    scratch = scratch or os.path.join(tempfile.gettempdir(), "gazette-spark")
    os.makedirs(scratch, exist_ok=True)
    builder = (
        SparkSession.builder.master(f"local[{cores}]").appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
        .config("spark.jars.ivy", os.path.join(scratch, "ivy"))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    started = time.monotonic()
    for attempt in (1, 2):
        try:
            spark = builder.getOrCreate()
            break
        except Exception as err:
            # PySpark starts its JVM with a fork and a Python preexec hook; in a process where
            # gRPC's threads are busy the child can die before it execs Java, silently (seen
            # once in a full test run: "JAVA_GATEWAY_EXITED" with no output from Java). The
            # fork is the only cost of starting over, so one more try is due.
            if attempt == 1 and "JAVA_GATEWAY_EXITED" in str(err):
                log.warning("the Spark JVM exited before it started (%s); starting it again", err)
                continue
            raise SetupError(f"the Spark session did not start: {err}") from err
    spark.sparkContext.setLogLevel("WARN")
    if importlib.util.find_spec("pyspark_gazette") is None:
        register(spark)  # Else Spark registered it statically, from the module.
    log.info("spark session ready in %.1fs (Spark %s)", time.monotonic() - started, spark.version)
    return spark


class Progress:
    """Reports running stages (tasks done of total, and time remaining at the rate so far)
    every ``interval`` seconds while it is open: ``with Progress(spark): df.write...``."""

    def __init__(self, spark: SparkSession, interval: float = 5.0,
                 out: Any = None) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._interval = interval
        self._out = out if out is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-progress", daemon=True)
        self._seen: dict[int, float] = {}

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def line(self) -> str | None:
        """One line describing the running stages, or None when none runs."""
        parts = []
        now = time.monotonic()
        for stage_id in self._tracker.getActiveStageIds():
            info = self._tracker.getStageInfo(stage_id)
            if info is None or not info.numTasks:
                continue
            began = self._seen.setdefault(stage_id, now)
            done = info.numCompletedTasks
            eta = ""
            if done:
                remaining = (now - began) / done * (info.numTasks - done)
                eta = f", about {remaining:.0f}s left"
            parts.append(f"stage {stage_id}: {done}/{info.numTasks} tasks"
                         f" ({info.numActiveTasks} running{eta})")
        return "; ".join(parts) or None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            text = self.line()
            if text:
                print(f"spark: {text}", file=self._out, flush=True)
