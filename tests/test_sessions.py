"""Sessions (multi-turn conversations): the group's ``session`` table and its validation, the
turns a session sends (deterministic from the seed), the recorded-conversation formats and
their errors, the chat body of a conversation, the session figures, and one short run on the
engine emulator whose readers stall on turn 2 and come back for turn 3."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from harness.analysis._sessions import prefix_reuse, session_figures
from harness.lifecycle import run_scenario
from harness.lifecycle._distributed import _as_workers_get_it
from harness.scenario import Scenario, load_scenario
from loadgen import (
    ConversationError,
    SessionConfig,
    UnknownKindError,
    UserGroupConfig,
    read_conversations,
    request_body,
    session_turns,
)
from tests.conftest import REPO

DATA = Path(__file__).parent / "data"


def _group(**fields: object) -> UserGroupConfig:
    base: dict[str, object] = {"name": "chat", "users": 2, "endpoint": "chat"}
    return UserGroupConfig.model_validate(base | fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"endpoint": "completions", "session": {"turns": 2}}, 'set endpoint = "chat"'),
        ({"requests_per_user": 2, "session": {"turns": 2}}, "requests_per_user does not apply"),
        (
            {"users": None, "arrival": {"kind": "constant", "rate_rps": 1, "requests": 2},
             "session": {"turns": 2}},
            "session does not apply to an open-loop group",
        ),
        ({"session": {"turns": 2, "action_turns": [3]}}, "session.action_turns: turn 3"),
        ({"session": {}}, "give turns (synthetic sessions) or file"),
        (
            {"session": {"turns": 2, "file": str(DATA / "sessions.jsonl")}},
            "one of them (got turns, file)",
        ),
        ({"session": {"turns": 2, "think_s": -1}}, "at least 0 (s)"),
        ({"session": {"turns": 2, "think_s": {"kind": "pareto"}}}, "valid kinds: exponential"),
        ({"session": {"turns": 2}, "mix": [{"name": "turn1", "weight": 1}]}, "'turn1'"),
        ({"session": {"file": str(DATA / "nowhere.jsonl")}}, "no conversation file"),
        ({"session": {"file": str(DATA / "sessions.jsonl"), "format": "csv"}}, "sharegpt"),
    ],
)  # fmt: skip
def test_session_config_errors_name_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        _group(**fields)
    assert message in str(err.value)


def test_a_session_group_needs_no_requests_per_user_and_names_its_turn_owners() -> None:
    group = _group(session={"turns": {"kind": "uniform", "min": 2, "max": 4}, "think_s": 0.5})
    assert group.requests_per_user is None
    assert group.owners() == ["chat.turn1", "chat.later_turns"]
    assert group.session is not None and group.session.applies_on(3)
    assert not SessionConfig(turns=3, action_turns=[2]).applies_on(3)


def test_synthetic_turns_are_deterministic_from_the_seed() -> None:
    session = SessionConfig(turns={"kind": "uniform", "min": 2, "max": 5})
    one = session_turns(session, 7, prompt_tokens=10)
    assert one == session_turns(session, 7, prompt_tokens=10)
    assert one != session_turns(session, 8, prompt_tokens=10)
    assert 2 <= len(one) <= 5
    assert all(t.words == 10 == len(t.text.split()) and t.max_tokens is None for t in one)
    assert len({t.text for t in one}) == len(one)  # each turn a new message


def test_recorded_sessions_are_taken_in_order() -> None:
    session = SessionConfig(file=DATA / "sessions.jsonl")
    recorded = session.sessions()
    first = session_turns(session, 1, prompt_tokens=5, recorded=recorded, order=0)
    assert [t.text for t in first] == ["My order never came.", "It was order 1234."]
    assert [(t.max_tokens, t.think_s, t.words) for t in first] == [(16, None, 4), (None, 0.1, 4)]
    second = session_turns(session, 1, prompt_tokens=5, recorded=recorded, order=3)
    assert [t.words for t in second] == [12, 6, 4]  # user_tokens: messages of that many words
    assert [len(t.text.split()) for t in second] == [12, 6, 4]


def test_sharegpt_sends_the_human_turns_with_the_answers_lengths() -> None:
    a, b = read_conversations(DATA / "sharegpt.json", "sharegpt")
    assert a.id == "a"
    assert [(t.user, t.max_tokens) for t in a.turns] == [
        ("Tell me a story about a cat", 8),
        ("And then?", None),
    ]
    assert [(t.user, t.max_tokens) for t in b.turns] == [("Hi", 2)]


@pytest.mark.parametrize(
    ("fmt", "text", "message"),
    [
        ("zerowindow", '{"turns": [{"user": "hi"}]}\n{"turns": []}\n', "f:2: not a session (turns"),
        ("zerowindow", '{"turns": [{"user": "hi", "user_tokens": 3}]}\n', "f:1: not a session"),
        ("zerowindow", "[1, 2]\n", "f:1: not a session (a session is a JSON object)"),
        ("zerowindow", "{oops\n", "f:1: not a session"),
        ("zerowindow", "\n\n", "f: no session in the file"),
        ("sharegpt", '{"id": 1}', "f: a ShareGPT file is a JSON list"),
        ("sharegpt", "[\n{}\n", "f:3: not JSON"),
        ("sharegpt", '[{"id": "x", "conversations": [{"from": "gpt", "value": "a"}]}]',
         "f: entry 0 (id 'x'): no human turn"),
        ("sharegpt", '[{"conversations": [{"from": "human"}]}]', "entry 0: message 0 needs"),
        ("sharegpt", '[{"id": "y"}]', "entry 0: needs a list under 'conversations'"),
    ],
)  # fmt: skip
def test_bad_conversation_files_name_the_file_and_line(
    fmt: str, text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "f"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConversationError) as err:
        read_conversations(path, fmt)
    assert str(err.value).startswith(str(tmp_path))
    assert message in str(err.value).replace(str(tmp_path) + "/", "")


def test_an_unknown_conversation_format_lists_the_registered_ones() -> None:
    with pytest.raises(UnknownKindError, match="sharegpt, zerowindow"):
        read_conversations(DATA / "sessions.jsonl", "csv")


def test_a_conversation_is_sent_as_chat_messages() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    body = request_body(
        endpoint="chat", model="m", prompt="", messages=messages, max_tokens=4, ignore_eos=True
    )
    assert body["messages"] == messages
    with pytest.raises(ValueError, match="chat endpoint"):
        request_body(endpoint="completions", model="m", prompt="", messages=messages,
                     max_tokens=4, ignore_eos=True)  # fmt: skip


def test_workers_get_the_recorded_sessions_whole() -> None:
    group = _group(session={"file": str(DATA / "sharegpt.json"), "format": "sharegpt"})
    carried = _as_workers_get_it(group, 0)
    assert carried.session is not None and carried.session.file is None
    again = UserGroupConfig.model_validate_json(carried.model_dump_json())  # as a worker reads it
    assert again.session is not None
    assert again.session.sessions() == read_conversations(DATA / "sharegpt.json", "sharegpt")


def test_session_figures_count_complete_sessions_and_their_duration() -> None:
    req = pd.DataFrame(
        {
            "session_id": ["a", "a", "b", "b", None],
            "turn": [1, 2, 1, 2, None],
            "session_end": [None, "done", None, "turn_failed", None],
            "t_send": [0.0, 1.0, 0.0, 1.0, 0.0],
            "t_end": [0.5, 3.0, 0.5, 1.5, 1.0],
        }
    )
    got = session_figures(req)
    assert got["sessions"] == 2 and got["sessions_complete"] == 1
    assert got["session_duration_p50_s"] == pytest.approx(3.0)
    assert session_figures(req.iloc[4:]) == {}


def test_a_gate_may_name_a_session_groups_turn_figures() -> None:
    base = load_scenario(REPO / "scenarios" / "sim-sessions.toml")
    data = base.model_dump(mode="json")
    data["gates"] = ["chat.turn1.ttft_p99_ms <= 1000", "chat.later_turns.ttft_ms ~ baseline"]
    Scenario.model_validate(data)
    data["groups"][0]["session"] = None
    data["groups"][0]["requests_per_user"] = 1
    with pytest.raises(ValidationError, match="unknown figure 'chat.turn1.ttft_p99_ms'"):
        Scenario.model_validate(data)


def test_a_reader_stalled_on_turn_2_comes_back_for_turn_3(tmp_path: Path) -> None:
    """The example scenario, smaller: 2 users, one 3-turn session each, the stall on turn 2
    held 0.3 s (a few seconds in all)."""
    base = load_scenario(REPO / "scenarios" / "sim-sessions.toml")
    chat = base.groups[0]
    assert chat.session is not None and chat.action is not None
    chat = chat.model_copy(
        update={
            "users": 2,
            "action": chat.action.model_copy(update={"hold_s": 0.3}),
            "session": chat.session.model_copy(update={"sessions_per_user": 1, "think_s": 0.05}),
        }
    )
    # Sessions whose conversation outgrows the engine's context: turn 2 is refused (HTTP 400),
    # and the session ends there.
    overflow = UserGroupConfig.model_validate(
        {"name": "overflow", "users": 1, "endpoint": "chat", "prompt_tokens": 100,
         "max_tokens": 40, "session": {"turns": 3}}
    )  # fmt: skip
    engine = base.target.engine.model_copy(update={"max_model_len": 230})  # type: ignore[union-attr]
    scenario = base.model_copy(
        update={
            "groups": [chat, overflow], "gates": [], "cooldown_s": 0.2, "max_duration_s": 30,
            "target": base.target.model_copy(update={"engine": engine}),
        }
    )  # fmt: skip
    result = run_scenario(scenario, out_root=tmp_path)
    every = pd.read_parquet(result.run_dir / "requests.parquet").sort_values(["session_id", "turn"])
    failed = every[every["group"] == "overflow"]
    assert failed["outcome"].tolist() == ["complete", "http_error"]
    assert failed["session_end"].tolist()[-1] == "turn_failed"
    requests = every[every["group"] == "chat"]
    assert len(requests) == 6 and requests["session_id"].nunique() == 2
    for _, turns in requests.groupby("session_id"):
        assert turns["turn"].tolist() == [1, 2, 3]
        assert turns["outcome"].tolist() == ["complete", "client_abort", "complete"]
        assert turns["action"].isna().tolist() == [True, False, True]  # only turn 2 stalls
        assert turns["session_end"].tolist()[-1] == "done"
        # the context grows by each earlier message and the answer as received: turn 2's
        # answer was cut short by the stall, so turn 3 carries only what was read of it
        words, out = 24, turns["completion_tokens"].tolist()
        assert turns["context_tokens"].tolist() == [0, words + out[0], 2 * words + out[0] + out[1]]
        assert out[1] < out[0]
        assert (turns["prompt_tokens"] > turns["context_tokens"]).all()  # the server's count
    figures = result.figures
    assert figures["chat.sessions"] == 2 and figures["chat.sessions_complete"] == 2
    assert figures["chat.session_duration_p50_s"] is not None
    assert figures["chat.turn1.requests"] == 2 and figures["chat.later_turns.requests"] == 4
    assert figures["chat.turn1.ttft_p50_ms"] is not None
    assert figures["chat.later_turns.outcome.client_abort"] == 2
    assert figures["overflow.sessions"] == 1 and figures["overflow.sessions_complete"] == 0
    assert figures["overflow.session_duration_p50_s"] is None  # of complete sessions only
    records = [json.loads(line) for line in (result.run_dir / "records-chat.jsonl").open()]
    assert {r["endpoint"] for r in records} == {"chat"}
    # The emulator's prefix cache (256 blocks, nothing else running) kept every conversation:
    # each returning turn was served at least the previous prompt's full blocks from it, turn 3
    # after the client stalled on turn 2.
    # (Turn 1's prompt, 31 tokens, fills no block of 32: turn 2 has nothing to find.)
    later = requests[requests["turn"] > 1]
    assert (later["prompt_cached_tokens"] >= later["prefix_kept_tokens"]).all(), later
    assert later["prefix_kept_tokens"].tolist() == [0, 96] * 2
    assert later["prefix_evicted"].tolist() == [pd.NA, False] * 2
    assert later["after_stall"].tolist() == [pd.NA, True] * 2
    assert figures["chat.returning_turns"] == 2 and figures["chat.prefix_evicted"] == 0
    assert figures["chat.prefix_evicted_after_stall_ratio"] == 0
    assert (
        figures["chat.turn1.prefix_hit_ratio"] == 0 < figures["chat.later_turns.prefix_hit_ratio"]
    )


def test_a_returning_turn_short_of_its_previous_prompts_blocks_found_it_evicted() -> None:
    req = pd.DataFrame(
        {
            "session_id": ["a", "a", "a", "b", "b", "c", "c", None],
            "turn": [1, 2, 3, 1, 2, 1, 2, None],
            "engine_prompt_tokens": [40, 90, 150, 40, 90, 10, 30, 10],
            "prompt_cached_tokens": [0, 32, 64, 0, 16, 0, 0, 0],
            "t_stall": [None, 5.0, None, None, None, None, None, None],
        },
        dtype=object,
    ).astype({"engine_prompt_tokens": float, "prompt_cached_tokens": float, "t_stall": float})
    got = prefix_reuse(req, block_tokens=16)
    # a2 kept turn 1's 32 tokens in full blocks (got 32); a3 needed 80 of turn 2's 90 (got 64);
    # b2 needed 32 (got 16); c1's 10 tokens filled no block, so c2 had nothing to find
    assert got["prefix_kept_tokens"].tolist()[:7] == [pd.NA, 32, 80, pd.NA, 32, pd.NA, 0]
    assert got["prefix_evicted"].tolist() == [pd.NA, False, True, pd.NA, True, pd.NA, pd.NA, pd.NA]
    assert got["after_stall"].tolist() == [pd.NA, False, True, pd.NA, False, pd.NA, pd.NA, pd.NA]
    figures = session_figures(got.assign(session_end=None, t_send=0.0, t_end=1.0))
    assert figures["returning_turns"] == 3 and figures["prefix_evicted"] == 2
    assert figures["prefix_evicted_ratio"] == pytest.approx(2 / 3)
    assert figures["prefix_evicted_after_stall_ratio"] == 1.0
    assert prefix_reuse(req, block_tokens=None) is req  # no block size: nothing to say


@pytest.mark.vllm
def test_sessions_on_vllm_send_the_conversation_and_find_it_cached(
    vllm_server: str, vllm_engine_dir: Path, tmp_path: Path
) -> None:
    """On the shared vLLM server (chat endpoint, the tiny model's chat template), with its
    engine probe: each turn's prompt, as vLLM counts it, holds the previous prompt and its
    answer, and vLLM's prefix cache served it at least the previous prompt's full blocks."""
    scenario = Scenario.model_validate(
        {
            "name": "vllm-sessions",
            "cooldown_s": 0.5,
            "target": {"kind": "url", "url": vllm_server, "served_model_name": "tiny",
                       "engine_dir": str(vllm_engine_dir)},
            "groups": [
                {"name": "chat", "users": 2, "endpoint": "chat", "prompt_tokens": 48,
                 "max_tokens": 16, "session": {"turns": 3, "think_s": 0.1}},
            ],
        }
    )  # fmt: skip
    result = run_scenario(scenario, out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    requests = pd.read_parquet(result.run_dir / "requests.parquet")
    assert set(requests["outcome"]) == {"complete"} and len(requests) == 6
    for _, turns in requests.sort_values("turn").groupby("session_id"):
        first, second = turns.iloc[0], turns.iloc[1]
        assert second["context_tokens"] == 48 + first["completion_tokens"]
        assert second["prompt_tokens"] >= first["prompt_tokens"] + first["completion_tokens"]
    later = requests[requests["turn"] > 1]
    shown = later[["turn", "engine_prompt_tokens", "prompt_cached_tokens", "prefix_kept_tokens"]]
    assert (later["prefix_kept_tokens"] >= 32).all(), shown  # blocks of 32 (SUITE_ARGS)
    assert (later["prompt_cached_tokens"] >= later["prefix_kept_tokens"]).all(), shown
    assert (later["prompt_cached_tokens"] % 32 == 0).all(), shown
    figures = result.figures
    assert figures["chat.sessions_complete"] == 2 and figures["chat.returning_turns"] == 4
    assert figures["chat.prefix_evicted"] == 0 and figures["chat.later_turns.prefix_hit_ratio"] > 0
    assert figures["chat.turn1.ttft_p50_ms"] is not None
    # The steps count blocks in use (vLLM's usage, of 63: 64 less its null block) and those kept
    # free as cache, which the conversations' freed blocks joined.
    steps = pd.read_parquet(result.run_dir / "engine_steps.parquet")
    assert steps["kv_blocks_in_use"].notna().all() and steps["kv_blocks_cached_free"].notna().all()
    assert (steps["kv_blocks_in_use"] == (steps["kv_cache_usage"] * 63).round()).all()
    assert figures["server.kv_blocks_cached_free_peak"] >= later["prefix_kept_tokens"].max() // 32
