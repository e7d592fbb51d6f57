"""The SWE recipe: fix a bug in a small Python repository; verified by hidden pytest tests."""

from __future__ import annotations

import atexit
import io
import logging
import shlex
import subprocess
import tarfile
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path

from components.core.episode.recipe_base import RecipeBase, ToolResult, ToolSpec, VerifyResult
from components.core.data.schema import Split, Task, ToolCall
from components.recipes.swe import calls
from components.recipes.swe.change import RepoChange, read_tree
from components.recipes.swe.generator import generate_tasks
from components.recipes.swe.setups import SetupArchives, SetupSnapshots, TaskSetup, setup_key, snapshot_key
from components.recipes.swe.tools import TOOL_SPECS, SWETools, git_init_script
from components.recipes.swe.verifier import PYTEST_ENV, verify_in_clean_room
from components.recipes.swe.warm_rooms import WarmRooms, WarmRun
from components.recipes.swe.warm_rooms import shared as warm_rooms_pool
from sandbox_service.client import Sandbox, SandboxClient
from sandbox_service.errors import SnapshotNotFoundError
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

log = logging.getLogger(__name__)

SANDBOX_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in the diff
    "GIT_CONFIG_COUNT": "1",  # an uploaded checkout is owned by another uid: trust it
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}


class SetupError(RuntimeError):
    """The task's environment could not be built (an infrastructure failure, never the policy's)."""


class SWERecipe(RecipeBase):
    name = "swe"

    @classmethod
    def scripted_teacher(cls, error_rate: float = 0.0, seed: int = 0):
        from components.recipes.swe.teacher import ScriptedTeacher

        return ScriptedTeacher(error_rate=error_rate, seed=seed)

    def import_tasks(self, kind: str, path: str, repos_dir: str | None = None) -> list[Task]:
        """SWE-bench-format instances (`kind` "swebench": JSONL, JSON or parquet) with their repositories'
        checkouts under `repos_dir` (components/recipes/swe/swebench.py)."""
        from components.core.episode.recipe_base import TaskImportError
        from components.recipes.swe.swebench import SWEBenchImportError, import_swebench

        if kind != "swebench":
            raise TaskImportError(f"the swe recipe imports SWE-bench files (source.kind=swebench), not {kind!r}")
        if not repos_dir:
            raise TaskImportError("a SWE-bench file needs repos_dir (where its repositories are checked out)")
        try:
            return import_swebench(path, repos_dir)
        except SWEBenchImportError as err:
            raise TaskImportError(str(err)) from err

    def check_task(self, client, task: Task):
        """The task's reference patch resolves it and the repository as given does not (components/recipes/swe/
        checks.py): two verifications, no episode."""
        from components.recipes.swe.checks import check_task

        return check_task(self, task, client)

    def __init__(
        self,
        difficulty: int | list[int] = 1,
        heldout_families: tuple[str, ...] | list[str] = (),
        tool_timeout_seconds: float = 30.0,
        max_output_chars: int = 2000,
        bugs: int | list[int] = 1,
        families: tuple[str, ...] | list[str] = (),
        packages: tuple[str, ...] | list[str] = (),
        warm_rooms: bool | WarmRooms = True,
    ):
        self.difficulty = difficulty
        self.families = tuple(families)  # bug families tasks are drawn from (empty: all)
        self.packages = tuple(packages)  # package names repositories are drawn from (empty: all)
        self.bugs = bugs  # planted bugs per task: 1, 2 (partial progress possible), or a list cycled over
        self.heldout_families = tuple(heldout_families)
        self.tool_timeout_seconds = tool_timeout_seconds
        self.max_output_chars = max_output_chars
        # sandbox id -> snapshot of its pristine state (taken at setup, before the agent's first step), for
        # tasks whose set-up is not kept (setups.py); the others are verified from the kept set-up
        self._pristine: dict[str, str] = {}
        self._lock = threading.Lock()
        self._setups = SetupArchives()
        self._setup_snapshots = SetupSnapshots()
        self._exit_hook: SandboxClient | None = None  # the client that deletes the kept snapshots at exit
        # Generated tasks are verified in warm rooms (warm_rooms.py; True: the process's pool); False: a clean
        # room per verification
        self._warm = warm_rooms if isinstance(warm_rooms, WarmRooms) else warm_rooms_pool() if warm_rooms else None

    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        return generate_tasks(
            split,
            n,
            seed,
            difficulty=self.difficulty,
            heldout_families=self.heldout_families,
            bugs=self.bugs,
            families=self.families,
            packages=self.packages,
        )

    def tools(self) -> list[ToolSpec]:
        return list(TOOL_SPECS)

    def system_prompt(self, task: Task) -> str:
        return (
            f"You fix bugs in the Python repository at {task.environment.workdir}. "
            "Inspect, edit and test with the tools, then submit."
        )

    def reference_calls(self, task: Task) -> list[ToolCall]:
        """The scripted teacher's clean path: list, read each file to fix, test, apply each fix, test, submit."""
        from components.recipes.swe.teacher import LIST_COMMAND, TEST_COMMAND

        meta = task.metadata
        fixes = meta.get("fixes") or ([meta["fix"]] if "fix" in meta else [])
        if not fixes:
            return []
        paths = list(dict.fromkeys(f["path"] for f in fixes))
        return [
            ToolCall(name="bash", arguments={"command": LIST_COMMAND}),
            *[ToolCall(name="read_file", arguments={"path": p}) for p in paths],
            ToolCall(name="bash", arguments={"command": TEST_COMMAND}),
            *[
                ToolCall(name="str_replace", arguments={"path": f["path"], "old_str": f["old"], "new_str": f["new"]})
                for f in fixes
            ],
            ToolCall(name="bash", arguments={"command": TEST_COMMAND}),
            ToolCall(name="submit", arguments={}),
        ]

    def sandbox_spec(self, task: Task) -> SandboxCreate:
        env = task.environment
        labels = {"orchard.recipe": "swe", "orchard.task": task.id[:63]}
        sandbox_env = dict(SANDBOX_ENV)
        if env.repo_path is None:
            # Generated repos need no plugins; skipping the venv's entry points makes pytest start ~3x faster.
            sandbox_env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return SandboxCreate(
            image=env.image,
            labels=labels,
            resources=Resources(cpu=env.cpu, memory_mb=env.memory_mb),
            network=NetworkPolicy(mode=env.network),
            env=sandbox_env,
            workdir=env.workdir,
        )

    def setup(self, sandbox: Sandbox, task: Task) -> None:
        """Place the repository. A task whose set-up is kept (setups.py) gets it in one operation, the first
        of its episodes setting it up and keeping it: files-only set-ups as an archive of the workdir, those
        that run commands as a snapshot restored into the sandbox (its pristine state too). Any other is set
        up here and snapshotted: the pristine state verification forks (`release` drops it)."""
        key = setup_key(task)
        if key is not None:
            with self._setups.lock(key):
                kept = self._setups.get(key)
                if kept is None:
                    self._setup_files(sandbox, task)
                    if self._keep_setup(sandbox, task, key):
                        return
                    self._snapshot_pristine(sandbox)
                    return
            sandbox.upload_archive(kept.archive, task.environment.workdir)
            return
        key = snapshot_key(task)
        if key is None:
            self._setup_files(sandbox, task)
            self._snapshot_pristine(sandbox)
            return
        with self._setup_snapshots.lock(key):  # siblings wait for the first set-up, then restore it
            snapshot = self._setup_snapshots.acquire(key)
            if snapshot is None:
                self._setup_files(sandbox, task)
                self._keep_setup_snapshot(sandbox, key)
                return
        try:
            sandbox.restore(snapshot)
        except SnapshotNotFoundError:  # the service no longer has it (it restarted): set up the long way
            self._setup_snapshots.forget(key, snapshot)
            self._setup_snapshots.release(snapshot)
            self._setup_files(sandbox, task)
            self._snapshot_pristine(sandbox)
            return
        except BaseException:
            self._setup_snapshots.release(snapshot)
            raise
        with self._lock:
            self._pristine[sandbox.id] = snapshot

    def _keep_setup_snapshot(self, sandbox: Sandbox, key: str) -> None:
        snapshot = sandbox.snapshot()
        with self._lock:
            self._pristine[sandbox.id] = snapshot.id
            if self._exit_hook is None:
                self._exit_hook = sandbox.client
                atexit.register(self.drop_kept_snapshots)
        for doomed in self._setup_snapshots.put(key, snapshot.id):
            _delete_snapshot(sandbox.client, doomed)

    def drop_kept_snapshots(self) -> None:
        """Delete the set-ups kept as snapshots that no episode uses now (at exit: registered with atexit
        when the first is kept); one in use goes at its episode's `release`."""
        client = self._exit_hook
        if client is not None:
            for snapshot in self._setup_snapshots.drain():
                _delete_snapshot(client, snapshot, at_exit=True)

    def _keep_setup(self, sandbox: Sandbox, task: Task, key: str) -> bool:
        """Keep the workdir just set up (nothing of the policy has run); False when it cannot be kept (too
        large to download or to keep), and the task is then verified from a snapshot as any other."""
        try:
            archive = sandbox.download_dir(task.environment.workdir)
            setup = TaskSetup(archive, read_tree(archive))
        except Exception as err:  # noqa: BLE001 - keeping is an optimisation: set-up itself has succeeded
            log.info("set-up of %s not kept (%s: %s)", task.id, type(err).__name__, err)
            return False
        return self._setups.put(key, setup)

    def _snapshot_pristine(self, sandbox: Sandbox) -> None:
        snapshot = sandbox.snapshot()
        with self._lock:
            self._pristine[sandbox.id] = snapshot.id

    def _setup_files(self, sandbox: Sandbox, task: Task) -> None:
        env = task.environment
        # No exec of its own for the workdir: an upload makes its target, and the script below makes it when
        # nothing was uploaded (one process start fewer per set-up).
        if env.repo_path:
            self._upload_checkout(sandbox, env.repo_path, env.base_commit, env.workdir)
        if env.files:
            with tempfile.TemporaryDirectory() as tmp:
                for rel, content in env.files.items():
                    path = Path(tmp) / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(content)
                sandbox.upload_dir(tmp, env.workdir)
        workdir = shlex.quote(env.workdir)
        script = " && ".join([f"mkdir -p -- {workdir}", f"cd -- {workdir}", git_init_script(), *env.setup_commands])
        result = sandbox.exec(["bash", "-c", script], cwd="/", timeout=120)
        if not result.ok:
            raise SetupError(
                f"setup script failed ({result.outcome.value}, exit {result.exit_code}): "
                f"{(result.stderr or result.message or '')[-500:]}"
            )

    @staticmethod
    def _upload_checkout(sandbox: Sandbox, repo_path: str, base_commit: str | None, workdir: str) -> None:
        """Upload the tree at `base_commit` without its history: later commits (the fix) stay invisible."""
        if not Path(repo_path).is_dir():
            raise SetupError(f"repo_path {repo_path} is not a directory on this machine")
        if base_commit is None:
            sandbox.upload_dir(repo_path, workdir)
            return
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "-C", repo_path, "archive", "--format=tar", base_commit], capture_output=True, check=False
            )
            if archive.returncode != 0:
                raise SetupError(f"git archive {base_commit} in {repo_path} failed: {archive.stderr.decode()[-300:]}")
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(tmp, filter="data")
            sandbox.upload_dir(tmp, workdir)

    def _tools(self, task: Task) -> SWETools:
        return SWETools(
            task.environment.workdir, timeout_seconds=self.tool_timeout_seconds, max_output_chars=self.max_output_chars
        )

    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        return self._tools(task).execute(sandbox, call)

    def health_calls(self, task: Task) -> list[ToolCall]:
        return [
            ToolCall(name="bash", arguments={"command": "git status --short"}),
            ToolCall(name="write_file", arguments={"path": ".orchard-health", "content": "ok\n"}),
            ToolCall(name="read_file", arguments={"path": ".orchard-health"}),
        ]

    def judge(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        """Hidden tests in a clean room or a warm room (see verifier.py); `final_answer` (the submit diff) is
        not trusted."""
        with self._lock:
            snapshot = self._pristine.get(sandbox.id)
        key = setup_key(task)
        kept = self._setups.get(key) if key is not None and snapshot is None else None
        spec = self.sandbox_spec(task)

        def clean_room(stack: ExitStack) -> Sandbox:
            room_spec = spec.model_copy(
                update={"labels": {**spec.labels, "orchard.role": "verifier"}, "from_snapshot": snapshot}
            )
            room = stack.enter_context(sandbox.client.create(room_spec))
            if snapshot is None and kept is not None:  # the kept set-up: one file operation
                room.upload_archive(kept.archive, task.environment.workdir)
            elif snapshot is None:  # forked or replayed episode, or the kept set-up dropped: build the state
                self._setup_files(room, task)
            return room

        warm = None
        warm_rooms = self._warm
        # `kept` is only looked up under a setup key, so `key` is set wherever `kept` is.
        if warm_rooms is not None and kept is not None and key is not None and not kept.tree.other:

            def warm(change: RepoChange, stdin: str) -> WarmRun | None:
                pristine = {p: d for p, d in kept.tree.files.items() if p.split("/", 1)[0] != ".git"}
                return warm_rooms.run(
                    sandbox.client,
                    spec,
                    calls.WORKER,
                    workdir=task.environment.workdir,
                    pristine_id=key,
                    pristine=pristine,
                    write=change.write,
                    delete=change.delete,
                    stdin=stdin,
                    timeout=task.verifier.timeout_seconds,
                    env=PYTEST_ENV,
                )

        return verify_in_clean_room(
            sandbox, task, clean_room, pristine=kept.tree if kept is not None else None, warm=warm
        )

    def release(self, sandbox: Sandbox) -> None:
        with self._lock:
            snapshot = self._pristine.pop(sandbox.id, None)
        if snapshot is not None and self._setup_snapshots.release(snapshot) is not False:
            sandbox.client.request("DELETE", f"/v1/snapshots/{snapshot}")


def _delete_snapshot(client: SandboxClient, snapshot: str, at_exit: bool = False) -> None:
    try:
        client.request("DELETE", f"/v1/snapshots/{snapshot}")
    except Exception as err:  # noqa: BLE001 - the service drops every snapshot when it restarts
        # At exit the client (or an embedded service) is often closed already: nothing is lost.
        (log.debug if at_exit else log.warning)("could not delete snapshot %s: %s", snapshot, err)
