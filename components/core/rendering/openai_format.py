"""Export and import trajectories in the OpenAI-messages shape of the published dataset.

A row has three columns:
  `tools`    JSON string: the OpenAI tool specs offered;
  `messages` list of {role, content, tool_call_id, tool_calls: [{id, type: "function",
             function: {name, arguments (JSON string)}}]};
  `metadata` JSON string with `verify_status` (resolved / unresolved / infra_error) and the rest.

Our `Trajectory` holds more than the shape (token ids, timings, credit, policy errors). On export
those extras go into `metadata.orchard`, so our own rows import back to an equal `Trajectory`;
rows from elsewhere import with what the shape holds. Assistant text is split into the thought
(`content`) and the native `tool_calls`; on import the protocol text is rebuilt from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.rendering.protocol import OPEN_TAG, format_tool_call
from components.core.data.schema import Outcome, Step, ToolCall, Trajectory
from components.core.data.parquet_store import TrajectoryStore, write_table_atomic

_FUNCTION = pa.struct([("name", pa.string()), ("arguments", pa.string())])
_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", _FUNCTION)])
_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_call_id", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
    ]
)
OPENAI_SCHEMA = pa.schema([("tools", pa.string()), ("messages", pa.list_(_MESSAGE)), ("metadata", pa.string())])

_STEP_SHAPE_FIELDS = {"index", "role", "content", "tool_call_id", "tool_call"}
_TRAJ_SHAPE_FIELDS = {"steps", "tools"}
_RESOLVED_LABELS = {"resolved", "success", "succeeded", "pass", "passed", "true", "1"}


class FormatError(ValueError):
    """A row is not in the OpenAI-messages shape; the message names the row and the field."""


def _thought(text: str) -> str:
    return text.split(OPEN_TAG, 1)[0].rstrip()


def trajectory_to_openai(traj: Trajectory) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    extras: list[dict[str, Any]] = []
    for step in traj.steps:
        msg: dict[str, Any] = {
            "role": step.role,
            "content": step.content,
            "tool_call_id": step.tool_call_id,
            "tool_calls": None,
        }
        if step.role == "assistant" and step.tool_call is not None:
            call = step.tool_call
            msg["content"] = _thought(step.content)
            msg["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
            ]
        extra = {k: v for k, v in step.model_dump(mode="json", exclude=_STEP_SHAPE_FIELDS).items() if v is not None}
        if msg["content"] != step.content:
            extra["raw_content"] = step.content
        messages.append(msg)
        extras.append(extra)
    rest = traj.model_dump(mode="json", exclude=_TRAJ_SHAPE_FIELDS)
    metadata = {
        "verify_status": traj.outcome.value,
        "task_id": traj.task_id,
        "policy_id": traj.policy_id,
        "orchard": {"trajectory": rest, "steps": extras},
    }
    return {"tools": json.dumps(traj.tools), "messages": messages, "metadata": json.dumps(metadata)}


def _outcome(label: Any) -> Outcome:
    text = str(label).strip().lower()
    if text in _RESOLVED_LABELS:
        return Outcome.resolved
    if text == Outcome.infra_error.value:
        return Outcome.infra_error
    return Outcome.unresolved


def openai_to_trajectory(row: dict[str, Any], *, row_id: str = "row") -> Trajectory:
    try:
        tools = json.loads(row["tools"]) if isinstance(row.get("tools"), str) else list(row.get("tools") or [])
        metadata = (
            json.loads(row["metadata"]) if isinstance(row.get("metadata"), str) else dict(row.get("metadata") or {})
        )
        messages = list(row["messages"])
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise FormatError(f"{row_id}: needs `tools` (JSON), `messages` (list) and `metadata` (JSON): {err}") from err
    orchard = metadata.get("orchard") or {}
    step_extras = orchard.get("steps") or []
    if len(step_extras) != len(messages):
        step_extras = [{} for _ in messages]
    names_by_call: dict[str, str] = {}
    steps: list[Step] = []
    for i, (msg, extra) in enumerate(zip(messages, step_extras)):
        extra = dict(extra)
        role = msg.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise FormatError(f"{row_id}: message {i} has role {role!r}")
        content = msg.get("content") or ""
        call = None
        native = msg.get("tool_calls") or []
        if role == "assistant" and native:
            fn = native[0].get("function") or {}
            args = fn.get("arguments") or "{}"
            try:
                parsed = json.loads(args) if isinstance(args, str) else dict(args)
            except json.JSONDecodeError as err:
                raise FormatError(f"{row_id}: message {i} tool call arguments are not JSON") from err
            call = ToolCall(id=native[0].get("id") or f"call-{i}", name=fn.get("name") or "", arguments=parsed)
            names_by_call[call.id] = call.name
            rebuilt = f"{content}\n{format_tool_call(call)}" if content else format_tool_call(call)
            content = extra.pop("raw_content", rebuilt)
        else:
            content = extra.pop("raw_content", content)
        tool_call_id = msg.get("tool_call_id")
        if role == "tool" and tool_call_id and "tool_name" not in extra:
            extra["tool_name"] = names_by_call.get(tool_call_id)
        steps.append(Step(index=i, role=role, content=content, tool_call=call, tool_call_id=tool_call_id, **extra))
    base = dict(orchard.get("trajectory") or {})
    if not base:
        base = {
            "task_id": str(metadata.get("task_id") or metadata.get("instance_id") or row_id),
            "recipe": metadata.get("recipe", "swe"),
            "policy_id": str(metadata.get("policy_id") or "imported"),
            "outcome": _outcome(metadata.get("verify_status")).value,
            "metadata": {k: v for k, v in metadata.items() if k != "orchard"},
        }
    return Trajectory.model_validate({**base, "steps": steps, "tools": tools})


def export_openai(trajectories: list[Trajectory], path: str | Path) -> Path:
    """Write one parquet file in the OpenAI-messages shape (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([trajectory_to_openai(t) for t in trajectories], schema=OPENAI_SCHEMA)
    return write_table_atomic(table, path)


def read_openai(path: str | Path) -> list[Trajectory]:
    """Trajectories from a local parquet file, a directory of them, or a JSONL file in this shape."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.parquet")) or sorted(path.rglob("*.jsonl"))
        if not files:
            raise FormatError(f"no .parquet or .jsonl files under {path}")
    elif path.exists():
        files = [path]
    else:
        raise FormatError(f"{path} does not exist")
    out: list[Trajectory] = []
    for file in files:
        if file.suffix == ".jsonl":
            rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        else:
            rows = pq.read_table(file).to_pylist()
        out += [openai_to_trajectory(r, row_id=f"{file.name}[{i}]") for i, r in enumerate(rows)]
    return out


def import_openai(path: str | Path, out_dir: str | Path) -> int:
    """Import such a dataset into a `TrajectoryStore` (what SFT reads); returns the row count."""
    trajectories = read_openai(path)
    TrajectoryStore(out_dir).append(trajectories)
    return len(trajectories)
