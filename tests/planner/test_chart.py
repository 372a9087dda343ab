"""The throughput–interactivity chart: formats, refusals before drawing, byte-identical output."""

import sys

import pytest

pytest.importorskip("matplotlib")

from planner.chart import write_chart
from simulator.specs.errors import SpecError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _point(load, tput, user, meets=True):
    return {"load": load, "throughput_tok_s_gpu": tput, "tok_s_user_p50": user,
            "tok_s_user_p90": None if user is None else user * 0.8, "meets_slo": meets}


CURVES = [
    {"label": "P 3xDEP2 + D 1xDEP32 (MTP2)",
     "points": [_point(load, 400.0 * load ** 0.5, 300.0 / (1 + load / 64), load <= 128)
                for load in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)]},
    {"label": "P 2xTP8 + D 2xDEP16",
     "points": [_point(8, 900.0, 210.0), _point(64, 2600.0, 120.0, False),
                _point(256, 4100.0, None, False)]},
]
ENVELOPE = [
    {"label": "P 2xTP8 + D 2xDEP16", "load": 8, "throughput_tok_s_gpu": 900.0,
     "tok_s_user_p50": 210.0},
    {"label": "P 3xDEP2 + D 1xDEP32 (MTP2)", "load": 64, "throughput_tok_s_gpu": 3200.0,
     "tok_s_user_p50": 150.0},
    {"label": "P 3xDEP2 + D 1xDEP32 (MTP2)", "load": 1024, "throughput_tok_s_gpu": 12800.0,
     "tok_s_user_p50": 17.6},
]


def _write(path, **kw):
    return write_chart(path, CURVES, ENVELOPE, title="DeepSeek-V3 on 64 GPUs", user_floor=50.0,
                       load_unit="users", **kw)


def test_png_for_two_curves_and_envelope(tmp_path):
    out = _write(tmp_path / "sweep.png")
    assert out == tmp_path / "sweep.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.png"]  # no temp file left


def test_svg_and_p90_axis(tmp_path):
    text = _write(tmp_path / "sweep.svg", user_axis="tok_s_user_p90").read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_pdf(tmp_path):
    assert _write(tmp_path / "sweep.pdf").read_bytes().startswith(b"%PDF")


def test_bad_suffix_refused_before_drawing(tmp_path):
    path = tmp_path / "sweep.jpg"
    with pytest.raises(SpecError, match=r"sweep\.jpg.*\.png, \.svg, \.pdf"):
        _write(path)
    assert list(tmp_path.iterdir()) == []


def test_missing_directory_refused(tmp_path):
    with pytest.raises(SpecError, match=r"directory .*nowhere.* does not exist"):
        _write(tmp_path / "nowhere" / "sweep.png")
    assert list(tmp_path.iterdir()) == []


def test_two_png_writes_byte_identical(tmp_path):
    first = _write(tmp_path / "a.png").read_bytes()
    assert _write(tmp_path / "b.png").read_bytes() == first


def test_two_svg_writes_byte_identical(tmp_path):
    first = _write(tmp_path / "a.svg").read_bytes()
    assert _write(tmp_path / "b.svg").read_bytes() == first


def test_empty_curves_refused(tmp_path):
    with pytest.raises(SpecError, match="nothing to plot"):
        write_chart(tmp_path / "sweep.png", [], ENVELOPE)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*_args, **_kw):
        raise OSError("disk full")

    monkeypatch.setattr("planner.chart.os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _write(tmp_path / "sweep.png")
    assert list(tmp_path.iterdir()) == []


def test_missing_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SpecError, match=r"pip install 'rackplan\[ui\]'"):
        _write(tmp_path / "sweep.png")
    assert list(tmp_path.iterdir()) == []
