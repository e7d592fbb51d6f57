"""OpenAI-messages dataset shape: export, datasets loading, lossless round trips, import for SFT."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.rendering.openai_format import (
    OPENAI_SCHEMA,
    export_openai,
    import_openai,
    openai_to_trajectory,
    read_openai,
    trajectory_to_openai,
)
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import Outcome, Step, ToolCall, Trajectory
from components.core.data.parquet_store import TrajectoryStore


def _traj(outcome=Outcome.resolved) -> Trajectory:
    call = ToolCall(name="read_file", arguments={"path": "pkg/core.py"})
    return Trajectory(
        task_id="t1",
        recipe="swe",
        policy_id="teacher",
        outcome=outcome,
        outcome_reason="x",
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
        steps=[
            Step(index=0, role="system", content="sys"),
            Step(index=1, role="user", content="issue"),
            Step(
                index=2,
                role="assistant",
                content="Let me look.\n" + format_tool_call(call),
                tool_call=call,
                token_ids=[1, 2, 3],
                credit=0.2,
                credited=True,
            ),
            Step(index=3, role="tool", content="def f(): pass", tool_call_id=call.id, tool_name="read_file"),
            Step(index=4, role="assistant", content="oops no call", policy_error="no tool call found"),
            Step(index=5, role="tool", content="Error: no tool call found", policy_error="no tool call found"),
        ],
        metadata={"family": "off_by_one"},
    )


def test_export_matches_the_published_shape_and_loads_with_datasets(tmp_path):
    import datasets

    path = export_openai([_traj(), _traj(Outcome.unresolved)], tmp_path / "ds" / "train.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert ds.column_names == ["tools", "messages", "metadata"]
    row = ds[0]
    assert json.loads(row["tools"])[0]["function"]["name"] == "read_file"
    assert json.loads(row["metadata"])["verify_status"] == "resolved"
    assert json.loads(ds[1]["metadata"])["verify_status"] == "unresolved"
    assistant = row["messages"][2]
    assert assistant["content"] == "Let me look."
    tc = assistant["tool_calls"][0]
    assert tc["type"] == "function" and json.loads(tc["function"]["arguments"]) == {"path": "pkg/core.py"}
    assert row["messages"][3]["tool_call_id"] == tc["id"]


def test_our_trajectories_round_trip_exactly(tmp_path):
    original = _traj()
    assert openai_to_trajectory(trajectory_to_openai(original)) == original
    path = export_openai([original], tmp_path / "a.parquet")
    assert read_openai(path) == [original]


def test_foreign_rows_import_and_round_trip_at_the_shape_level(tmp_path):
    foreign = {
        "tools": json.dumps([{"type": "function", "function": {"name": "bash"}}]),
        "messages": [
            {"role": "system", "content": "s", "tool_call_id": None, "tool_calls": None},
            {"role": "user", "content": "fix", "tool_call_id": None, "tool_calls": None},
            {
                "role": "assistant",
                "content": "",
                "tool_call_id": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
                ],
            },
            {"role": "tool", "content": "a.py", "tool_call_id": "c1", "tool_calls": None},
        ],
        "metadata": json.dumps({"verify_status": "success", "instance_id": "repo__1"}),
    }
    pq.write_table(pa.Table.from_pylist([foreign], schema=OPENAI_SCHEMA), tmp_path / "foreign.parquet")
    (traj,) = read_openai(tmp_path)
    assert traj.outcome is Outcome.resolved and traj.task_id == "repo__1"
    assert traj.steps[2].tool_call.arguments == {"command": "ls"}
    assert traj.steps[2].content == '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert traj.steps[3].tool_name == "bash"
    again = trajectory_to_openai(traj)
    assert again["messages"] == foreign["messages"] and json.loads(again["tools"]) == json.loads(foreign["tools"])
    assert json.loads(again["metadata"])["verify_status"] == "resolved"


def test_import_into_a_trajectory_store_for_sft(tmp_path):
    original = _traj()
    (tmp_path / "in.jsonl").write_text(json.dumps(trajectory_to_openai(original)) + "\n")
    assert import_openai(tmp_path / "in.jsonl", tmp_path / "store") == 1
    assert TrajectoryStore(tmp_path / "store").read() == [original]
