"""The trace format: the reader's typed errors, each naming the line, and the synthetic traces."""

import pytest

from kvstore.bench.trace.format import BLOCK_TOKENS, TraceFormatError, parse_line, read_trace, write_trace
from kvstore.bench.trace.synth import SynthSpec, generate
from kvstore.errors import InvalidArgument

GOOD = '{"timestamp": 5, "input_length": 1025, "output_length": 3, "hash_ids": [7, 8, 9]}'


def test_a_good_line():
    request = parse_line(GOOD)
    assert request.hash_ids == (7, 8, 9) and request.timestamp_ms == 5 and request.input_length == 1025
    assert request.tokens_in(3) == 1025 and request.tokens_in(2) == 2 * BLOCK_TOKENS


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field(s) hash_ids"),
        ('{"input_length": 10, "hash_ids": [1]}', "missing field(s) timestamp, output_length"),
        (
            '{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
            "2 hash_ids for input_length 1025",
        ),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}', "expected ceil(10 / 512) = 1"),
        ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}', "timestamp must be"),
        ('{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}', "input_length must be"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}', "list of integers"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [4, 4]}', "repeats"),
    ],
)
def test_bad_lines_raise_a_typed_error_naming_the_line(tmp_path, line, reason):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n\n" + line + "\n")
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert info.value.line == 3 and reason in info.value.reason
    assert str(info.value).startswith(f"{path}:3: ")
    assert isinstance(info.value, InvalidArgument)  # the CLI reports it in one line


def test_timestamps_must_not_go_back_and_a_trace_must_have_requests(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n" + GOOD.replace('"timestamp": 5', '"timestamp": 4') + "\n")
    with pytest.raises(TraceFormatError, match=r":2: timestamp 4 is before the previous 5"):
        read_trace(path)
    path.write_text("\n")
    with pytest.raises(TraceFormatError, match="no requests"):
        read_trace(path)


def test_limit_reads_only_the_first_requests(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n" + GOOD + "\n{broken\n")
    assert len(read_trace(path, limit=2)) == 2  # the bad line after them is never read


def test_synthetic_traces_are_valid_deterministic_and_share_prefixes(tmp_path):
    spec = SynthSpec(requests=150, seed=7)
    trace = generate(spec)
    assert trace == generate(spec) and trace != generate(SynthSpec(requests=150, seed=8))
    path = tmp_path / "synth.jsonl"
    write_trace(path, trace)
    assert read_trace(path) == trace  # what the generator writes, the reader takes
    firsts = [r.hash_ids[0] for r in trace]
    assert len(set(firsts)) <= spec.system_prompts  # every prompt starts with a shared system prompt
    assert all(b >= a for a, b in zip([r.timestamp_ms for r in trace], [r.timestamp_ms for r in trace][1:]))
