"""Tolerant parsing of judge answers and the verdict-token probability."""

from __future__ import annotations

import json

import pytest

from mmpipe.reward import ActionVerdict, ProgressEstimate, extract_json, parse_action, parse_progress
from mmpipe.reward.parsing import verdict_probability

from judge_server import verdict_logprobs

ACTION = {"reasonable": True, "confidence": 0.8, "reason": "near the cube"}


@pytest.mark.parametrize("text", [
    json.dumps(ACTION),
    "```json\n" + json.dumps(ACTION) + "\n```",
    "Here is my evaluation:\n```\n" + json.dumps(ACTION, indent=2) + "\n```\nThanks.",
    "Sure! " + json.dumps(ACTION) + " Hope this helps {not json}",
    "<think>maybe {\"reasonable\": false}</think>\n" + json.dumps(ACTION),
    '{"note": "first object lacks the keys"} then ' + json.dumps(ACTION),
])
def test_action_found_in_noisy_text(text):
    value, error = parse_action(text)
    assert error is None
    assert value == ActionVerdict(True, 0.8, "near the cube")


@pytest.mark.parametrize("raw, expected", [
    ({"reasonable": "yes", "confidence": "0.7"}, ActionVerdict(True, 0.7, "")),
    ({"reasonable": "False", "confidence": "70%", "reason": "no"}, ActionVerdict(False, 0.7, "no")),
    ({"reasonable": False, "confidence": 1, "reason": None}, ActionVerdict(False, 1.0, "")),
])
def test_action_lenient_values(raw, expected):
    assert parse_action(json.dumps(raw)) == (expected, None)


@pytest.mark.parametrize("text, needle", [
    ("I cannot tell from this image.", "no JSON object"),
    ("", "no JSON object"),
    ('{"reasonable": true}', "lacks ['confidence']"),
    ('{"confidence": 0.5, "reason": "x"}', "lacks ['reasonable']"),
    ('{"reasonable": "maybe", "confidence": 0.5}', "'reasonable' must be true/false"),
    ('{"reasonable": true, "confidence": 1.7}', "'confidence' must be a number in [0, 1]"),
    ('{"reasonable": true, "confidence": "high"}', "'confidence' must be a number in [0, 1]"),
    ('{"reasonable": true, "confidence": 0.9', "no JSON object"),  # cut at max_tokens
])
def test_action_invalid_says_why(text, needle):
    value, error = parse_action(text)
    assert value is None and needle in error


def test_progress_parsing():
    assert parse_progress('```json\n{"progress": 0.25, "stage": "reach", "next_step": "grasp"}\n```') == (
        ProgressEstimate(0.25, "reach", "grasp"), None)
    assert parse_progress('progress so far: {"progress": "40%"}')[0] == ProgressEstimate(0.4)
    for text, needle in [('{"stage": "x"}', "lacks 'progress'"), ('{"progress": 75}', "[0, 1]"),
                         ('{"progress": true}', "[0, 1]"), ("nothing", "no JSON object")]:
        value, error = parse_progress(text)
        assert value is None and needle in error, (text, error)


def test_extract_json_prefers_object_with_required_keys():
    text = '{"a": 1} and {"progress": 0.5}'
    assert extract_json(text) == {"a": 1}
    assert extract_json(text, ["progress"]) == {"progress": 0.5}
    assert extract_json("[1, 2]") is None


@pytest.mark.parametrize("p_true", [0.9, 0.3, 0.5])
@pytest.mark.parametrize("verdict", ["true", "false"])
def test_verdict_probability_from_top_logprobs(p_true, verdict):
    text = '{"reasonable": %s, "confidence": 0.9, "reason": "x"}' % verdict
    assert verdict_probability(verdict_logprobs(text, p_true)) == pytest.approx(p_true)


def test_verdict_probability_without_alternatives():
    tokens = verdict_logprobs('{"reasonable": false, "confidence": 0.9}', 0.2)
    for t in tokens:
        t["top_logprobs"] = []
    # Only the sampled token "false" with P = 0.8 is known: P(true) = 1 - 0.8.
    assert verdict_probability(tokens) == pytest.approx(0.2)
    assert verdict_probability(verdict_logprobs('{"progress": 0.5}', 0.5)) is None
    assert verdict_probability(None) is None
