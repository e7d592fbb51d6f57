"""The GUI (browser) recipe: a generated local website and a headless Chromium, both inside the
sandbox, on the same sandbox service, harness and stages as SWE.

Setup places the site server and the browser controller into `/workspace`, starts both as
background jobs (network: loopback only) and waits until the controller answers. Each tool call is
then one short exec of `ctl.py` with the request on stdin (see `sandbox/browser_controller.py`), and the
verifier reads the site's `state.json` back through the file API after the episode. Arguments are
bounded by the tool specs (checked by the harness before a call runs); the controller refuses any other
malformed request as the policy's error, and a failure the recipe cannot attribute (no answer, a
controller error) goes to the one rule (`core/episode/blame.py`).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.episode.recipe_base import RecipeBase, ToolResult, ToolSpec, VerifyResult
from components.core.data.schema import Split, Task, ToolCall
from components.recipes.common import families_for_split
from components.recipes.gui.tasks import FAMILIES, SITE_PORT, content, families_at, generate_tasks
from components.core.data.schema import Verification
from components.recipes.gui.verify import NAME as VERIFIER_NAME
from components.recipes.gui.verify import VERSION as VERIFIER_VERSION
from components.recipes.gui.verify import verify_state
from components.recipes.gui.vision import ScreenshotStore
from sandbox_service.client import Sandbox
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

GUI_DIR = "/workspace/.gui"
SITE_DIR = "/workspace/site"
SOCKET = f"{GUI_DIR}/ctl.sock"
CTL = f"{GUI_DIR}/ctl.py"
STATE = f"{SITE_DIR}/state.json"
JOB_SECONDS = 4 * 3600  # background jobs live as long as any episode; the sandbox's deletion ends them


class GUIOptions(BaseModel):
    """Recipe options (`get_recipe("gui", **options)`)."""

    model_config = ConfigDict(extra="forbid")
    families: tuple[str, ...] = Field(FAMILIES, description="Task families to generate (cycled in order).")
    difficulty: int | list[int] | None = Field(
        None, description="Keep only families at these difficulty level(s) (see tasks.DIFFICULTY); None = all."
    )
    heldout_families: tuple[str, ...] = Field(
        (),
        description="Families only the held-out split draws from (train and validation never do): what a "
        "claim about generalising to unseen kinds of task needs.",
    )
    attach_screenshots: bool = Field(False, description="Attach a PNG to every action's result (vision policies).")
    step_timeout_seconds: float = Field(60.0, gt=0, description="Limit for one browser action.")
    startup_timeout_seconds: float = Field(90.0, gt=0, description="Limit for site + Chromium start-up.")
    memory_mb: int = Field(2048, ge=512, description="Sandbox memory (Chromium needs ~500 MiB).")


MAX_TYPED = 10_000  # characters one `type` (or `answer`) may carry: far more than any form field of a task
MAX_URL = 2_000  # characters of a URL
_ELEMENT = {"type": "integer", "minimum": 0, "maximum": 100_000}  # the controller's own range for integers


def _file(name: str) -> str:
    return resources.files("components.recipes.gui.sandbox").joinpath(name).read_text()


TOOLS = [
    ToolSpec(
        name="read_page",
        description='Show the current page as text; interactive elements appear as [id] role "label".',
        parameters={"type": "object", "properties": {}},
    ),
    ToolSpec(
        name="click",
        description="Click the element with this id (links, buttons, checkboxes).",
        parameters={"type": "object", "properties": {"element_id": _ELEMENT}, "required": ["element_id"]},
    ),
    ToolSpec(
        name="type",
        description="Type text into a textbox, or choose an option of a select by its label.",
        parameters={
            "type": "object",
            "properties": {
                "element_id": _ELEMENT,
                "text": {"type": "string", "maxLength": MAX_TYPED},
                "submit": {"type": "boolean", "description": "press Enter afterwards"},
            },
            "required": ["element_id", "text"],
        },
    ),
    ToolSpec(
        name="scroll",
        description="Scroll the page.",
        parameters={
            "type": "object",
            "properties": {
                "direction": {"type": "string", "enum": ["up", "down"]},
                "amount": {"type": "integer", "minimum": -100_000, "maximum": 100_000},
            },
            "required": ["direction"],
        },
    ),
    ToolSpec(
        name="navigate",
        description="Open a URL of the task's local site (absolute or relative).",
        parameters={
            "type": "object",
            "properties": {"url": {"type": "string", "maxLength": MAX_URL}},
            "required": ["url"],
        },
    ),
    ToolSpec(
        name="screenshot",
        description="Take a PNG screenshot of the viewport (for vision models).",
        parameters={"type": "object", "properties": {}},
    ),
    ToolSpec(
        name="answer",
        description="Finish the task. If the task asks a question, the text is only the answer "
        "(one value, e.g. 'Blue Lamp' or '1204'), not a list of candidates.",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": MAX_TYPED}},
            "required": ["text"],
        },
    ),
]
_TOOL_NAMES = {t.name for t in TOOLS}


class GUIRecipe(RecipeBase):
    name = "gui"

    @classmethod
    def scripted_teacher(cls, error_rate: float = 0.0, seed: int = 0):
        from components.recipes.gui.teacher import ScriptedTeacher

        return ScriptedTeacher(error_rate=error_rate, seed=seed)

    def __init__(self, screenshot_store: ScreenshotStore | None = None, **options: Any):
        """`screenshot_store` receives every PNG by tool-call id for `VisionOpenAIPolicy` (see vision.py)."""
        self.options = GUIOptions(**options)
        self.screenshot_store = screenshot_store

    # -- tasks and tools -------------------------------------------------------------------------
    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        pool = families_at(self.options.families, self.options.difficulty)
        return generate_tasks(split, n, seed, families_for_split(pool, self.options.heldout_families, split))

    def task_content(self, task: Task) -> dict:
        return content(task)

    def tools(self) -> list[ToolSpec]:
        return list(TOOLS)

    def system_prompt(self, task: Task) -> str:
        return (
            "You operate a web browser through tools to complete the user's task on a local website. "
            'Every action returns the page as text; elements you can use appear as [id] role "label". '
            "When the task is done call answer (with the answer text if the task asks a question)."
        )

    # -- environment -----------------------------------------------------------------------------
    def sandbox_spec(self, task: Task) -> SandboxCreate:
        return SandboxCreate(
            labels={"recipe": "gui", "task": task.id[:63]},
            resources=Resources(
                cpu=task.environment.cpu, memory_mb=max(self.options.memory_mb, task.environment.memory_mb), pids=2048
            ),
            network=NetworkPolicy(mode="loopback"),
            # Chromium and the Playwright driver write caches under HOME/TMPDIR: keep them in /workspace.
            env={
                "HOME": f"{GUI_DIR}/home",
                "TMPDIR": f"{GUI_DIR}/tmp",
                "XDG_CONFIG_HOME": f"{GUI_DIR}/home/.config",
                "XDG_CACHE_HOME": f"{GUI_DIR}/home/.cache",
            },
            workdir="/workspace",
        )

    def setup(self, sandbox: Sandbox, task: Task) -> None:
        site = task.metadata.get("site")
        if not site:
            raise ValueError(f"GUI task {task.id} has no metadata['site']; generate tasks with GUIRecipe.tasks()")
        sandbox.exec(["mkdir", "-p", SITE_DIR, f"{GUI_DIR}/home", f"{GUI_DIR}/tmp", f"{GUI_DIR}/shots"])
        sandbox.write_file(f"{SITE_DIR}/site_server.py", _file("site_server.py"))
        sandbox.write_file(f"{SITE_DIR}/data.json", json.dumps(site))
        sandbox.write_file(f"{GUI_DIR}/browser_controller.py", _file("browser_controller.py"))
        sandbox.write_file(CTL, _file("ctl.py"))
        self._start(sandbox, task)

    def resume(self, sandbox: Sandbox, task: Task) -> None:
        """A fork of a set-up sandbox has the site and controller files but neither process: start both."""
        self._start(sandbox, task)

    def _start(self, sandbox: Sandbox, task: Task) -> None:
        """Start the site server and the browser controller; wait until the controller answers. The browser
        gets an empty profile every time (a forked one would hold the previous Chromium's locks)."""
        sandbox.exec(["bash", "-c", f"rm -rf {GUI_DIR}/profile && mkdir -p {GUI_DIR}/profile"])
        site_job = sandbox.exec_async(
            [
                "python",
                f"{SITE_DIR}/site_server.py",
                "--data",
                f"{SITE_DIR}/data.json",
                "--state",
                STATE,
                "--port",
                str(SITE_PORT),
            ],
            timeout=JOB_SECONDS,
        )
        browser_job = sandbox.exec_async(
            [
                "python",
                f"{GUI_DIR}/browser_controller.py",
                "--socket",
                SOCKET,
                "--start-url",
                task.metadata["start_url"],
                "--profile-dir",
                f"{GUI_DIR}/profile",
            ],
            timeout=JOB_SECONDS,
        )
        wait = self.options.startup_timeout_seconds
        res = sandbox.exec(["python", "-S", CTL, "--wait", str(wait), SOCKET, '{"action": "ping"}'], timeout=wait + 10)
        if not res.ok:
            detail = []
            for job in (site_job, browser_job):
                info = sandbox.client.get_job(job.id)
                if info.result is not None:
                    detail.append(f"job {job.id} exited {info.result.exit_code}: {info.result.stderr[-800:]}")
            raise RuntimeError(
                f"GUI sandbox did not start (browser controller unreachable after {wait:.0f}s): "
                f"{res.stdout.strip()} {' '.join(detail)}"
            )

    # -- tools -----------------------------------------------------------------------------------
    def _browser(self, sandbox: Sandbox, request: dict) -> tuple[dict, str | None]:
        """(answer, infra_error): the controller's JSON answer, or ({}, why the environment failed)."""
        timeout = self.options.step_timeout_seconds
        res = sandbox.exec(["python", "-S", CTL, SOCKET], stdin=json.dumps(request), timeout=timeout)
        if res.is_infra_error:
            return {}, f"sandbox exec failed: {res.infra_error} {res.message or ''}".strip()
        if res.exit_code != 0:
            return (
                {},
                f"browser controller unreachable (exit {res.exit_code}): {res.stdout[-300:]} {res.stderr[-300:]}",
            )
        try:
            return json.loads(res.stdout), None
        except json.JSONDecodeError:
            return {}, f"browser controller sent no JSON: {res.stdout[-300:]!r}"

    def _screenshot(self, sandbox: Sandbox, name: str) -> tuple[bytes | None, str | None]:
        path = f"{GUI_DIR}/shots/{name}.png"
        answer, infra = self._browser(sandbox, {"action": "screenshot", "path": path})
        if infra or not answer.get("ok"):
            return None, infra or answer.get("error")
        return sandbox.read_file(path), None

    def health_calls(self, task: Task) -> list[ToolCall]:
        return [ToolCall(name="read_page", arguments={})]

    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        args = call.arguments or {}
        if call.name not in _TOOL_NAMES:
            return ToolResult(
                output=f"Error: unknown tool {call.name!r}; use one of {sorted(_TOOL_NAMES)}.",
                policy_error=f"unknown tool {call.name!r}",
            )
        if call.name == "answer":
            text = str(args.get("text", ""))
            return ToolResult(output="Answer recorded.", submitted=True, final_answer=text)
        if call.name == "screenshot":
            png, err = self._screenshot(sandbox, call.id)
            if png is None:
                return ToolResult(output=f"Error: {err}", infra_error=err)
            self._keep(call, png)
            return ToolResult(output=f"Screenshot taken ({len(png)} bytes PNG).", image_png=png)
        request = {
            "action": call.name,
            **{k: v for k, v in args.items() if k in ("element_id", "text", "submit", "direction", "amount", "url")},
        }
        answer, infra = self._browser(sandbox, request)
        if infra:
            return ToolResult(output=f"Error: the browser failed: {infra}", infra_error=infra)
        if answer.get("controller_error"):
            return ToolResult(
                output=f"Error: the browser failed: {answer.get('error')}", infra_error=answer.get("error")
            )
        if not answer.get("ok"):
            return ToolResult(output=f"Error: {answer.get('error')}", policy_error=answer.get("error"))
        png = None
        if self.options.attach_screenshots:
            png, _ = self._screenshot(sandbox, call.id)
            self._keep(call, png)
        return ToolResult(output=answer["page"], image_png=png)

    def _keep(self, call: ToolCall, png: bytes | None) -> None:
        if png is not None and self.screenshot_store is not None:
            self.screenshot_store.put(call.id, png)

    # -- verification ----------------------------------------------------------------------------
    def judge(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        try:
            state = json.loads(sandbox.read_file(STATE))
        except Exception as err:  # noqa: BLE001 - no verdict: whose failure, the one rule decides (see verify.py)
            return VerifyResult(
                resolved=False,
                infra_error=f"could not read site state {STATE}: {err}",
                verification=Verification(verifier=VERIFIER_NAME, version=VERIFIER_VERSION),
            )
        verdict = verify_state(state, final_answer, task.verifier.expected)
        verdict.verification = Verification(verifier=VERIFIER_NAME, version=VERIFIER_VERSION)
        return verdict
