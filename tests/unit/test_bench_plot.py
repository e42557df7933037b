"""plot: a bench record (tests/unit/fixtures/bench/record-v2.json, in the format bench writes) drawn as two panels
with the recipe's published figures; a second record drawn over it; the PNG written; matplotlib missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from operations.validate import plot
from operations.validate.__main__ import main
from operations.validate.bench import load_record
from operations.validate.result import NOT_RUN, PASS

RECORD = Path(__file__).parent / "fixtures" / "bench" / "record-v2.json"


def lines(axes) -> dict[str, tuple[list, list]]:
    """label -> (x, y) of each line a panel draws (error bars included, by their label)."""
    out = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()}
    for container in axes.containers:
        x, y = container.lines[0].get_data()
        out[container.get_label()] = (list(x), list(y))
    return out


def test_one_record_is_two_panels_with_the_recipe_figures():
    figure = plot.build_figure([("A: record-v2.json", load_record(str(RECORD)))])
    assert len(figure.axes) == 2
    prefill, decode = figure.axes

    assert prefill.get_title() == "prefill" and prefill.get_xscale() == "log"
    assert prefill.get_xlabel() == "prompt tokens (log scale)" and prefill.get_ylabel() == "tok/s"
    assert [t.get_text() for t in prefill.get_xticklabels()] == ["4K", "32K", "256K"]
    drawn = lines(prefill)
    assert drawn["A: record-v2.json"] == ([4097, 32771, 262139], [2097.8, 2126.6, 2098.8])
    assert drawn["recipe (published): ~2,100–2,150 tok/s, 4K to 256K"] == ([4096, 262144], [2125.0, 2125.0])

    assert decode.get_title() == "decode: prose, temperature 0, thinking off"  # the recipe's condition, not code
    assert decode.get_xlabel() == "concurrent streams"
    drawn = lines(decode)
    assert drawn["A: record-v2.json total"] == ([1, 2, 3, 4], [80.2, 118.5, 139.9, 153.1])
    assert drawn["A: record-v2.json per stream"] == ([1, 2, 3, 4], [80.2, 59.6, 46.8, 38.4])
    assert drawn["recipe (published) total: 80.7 at 1 stream, 154.0 at 4"] == ([1, 4], [80.7, 154.0])
    assert [t.get_text() for t in decode.get_legend().get_texts()] == [
        "A: record-v2.json total", "A: record-v2.json per stream",
        "recipe (published) total: 80.7 at 1 stream, 154.0 at 4"]


def test_a_second_record_is_drawn_over_the_first():
    before = load_record(str(RECORD))
    after = json.loads(json.dumps(before))
    for r in after["prefill_sweep"]:
        r["tok_s"] = round(r["tok_s"] * 0.9, 1)
    figure = plot.build_figure([("A: before.json", before), ("B: after.json", after)])
    prefill, decode = figure.axes
    drawn = lines(prefill)
    assert drawn["B: after.json"][1] == [1888.0, 1913.9, 1888.9]
    by_label = {line.get_label(): line for line in prefill.get_lines()}
    assert by_label["A: before.json"].get_linestyle() == "-" and by_label["B: after.json"].get_linestyle() == "--"
    assert {"A: before.json total", "B: after.json total", "B: after.json per stream"} <= set(lines(decode))


def test_a_version_1_record_draws_its_headline_figures():
    v1 = {"kind": "sparkfold-bench", "version": 1, "prefill": {"prompt_tokens": 4100, "seconds": 1.95, "tok_s": 2100.0},
          "decode": {"completion_tokens": 256, "ttft_s": 0.13, "seconds": 3.3, "tok_s": 80.0},
          "multi": {"streams": 4, "completion_tokens": 1024, "seconds": 6.6, "tok_s_total": 154.0,
                    "tok_s_per_stream": 38.5}}
    assert plot.prefill_points(v1) == [(4100, 2100.0)]
    assert plot.decode_condition(v1) is None
    assert plot.decode_points(v1, None) == [(1, 80.0, 80.0), (4, 154.0, 38.5)]
    decode = plot.build_figure([("A: v1.json", v1)]).axes[1]
    assert decode.get_title() == "decode: the headline figures"
    assert lines(decode)["A: v1.json total"] == ([1, 4], [80.0, 154.0])


def test_the_plot_command_writes_a_png(tmp_path, capsys):
    out = tmp_path / "bench.png"
    assert main(["plot", str(RECORD), str(RECORD), "-o", str(out)]) == PASS
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" == plot.PNG_SIGNATURE
    assert capsys.readouterr().out == (f"PASS plot: {out}: prefill and decode of {RECORD} against {RECORD}, with the "
                                       "recipe's published figures\n")


def test_without_matplotlib_it_names_the_extra(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: `import` raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "bench.png"
    assert main(["plot", str(RECORD), "-o", str(out)]) == NOT_RUN
    assert capsys.readouterr().out == ("NOT RUN plot: matplotlib is not installed (the optional `plot` extra): "
                                       "pip install -e '.[plot]'\n")
    assert not out.exists()


@pytest.mark.parametrize("words, says", [
    ([], "NOT RUN plot: usage: python -m operations.validate plot A.json [B.json] [-o bench.png]"),
    ([str(RECORD)] * 3, "NOT RUN plot: usage: python -m operations.validate plot A.json [B.json] [-o bench.png]"),
    (["missing.json"], "NOT RUN plot: [Errno 2] No such file or directory: 'missing.json'"),
])
def test_plot_of_nothing_to_draw_could_not_run(tmp_path, capsys, words, says):
    assert main(["plot", *words, "-o", str(tmp_path / "x.png")]) == NOT_RUN
    assert capsys.readouterr().out == says + "\n"


def test_the_validator_starts_without_importing_matplotlib():
    import subprocess

    code = "import sys, operations.validate.__main__; print(sorted(m for m in sys.modules if 'matplotlib' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout
    assert out == "[]\n"
