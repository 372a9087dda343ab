"""benchmarks/compare_aic.py on a hand-made predictions CSV of three real rows (no .venv-aic)."""

import json

import pandas as pd
import pytest

from simulator.validate import load_rows
from tests.benchmarks.scripts import load_script

QWEN = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h100_sxm_trtllm_agg_"
ROWS = (QWEN + "512x128_c4_tp4_epnone_1", QWEN + "512x256_c4_tp4_epnone_2",
        "dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81")
"""Short, low-concurrency rows that simulate in well under a second each."""


ca = load_script("compare_aic")


def test_mapes_of_both_tools_on_the_rows_aiconfigurator_predicted(tmp_path, capsys):
    measured = load_rows().set_index("id").loc[list(ROWS)]
    preds = tmp_path / "aic.csv"
    aic = {ROWS[0]: (2.0, 1.5), ROWS[1]: (0.5, 0.8)}  # multiples of the measured values
    lines = ["id,aic_ttft_ms,aic_tpot_ms,aic_backend_version,reason"]
    for rid, (ft, fp) in aic.items():
        m = measured.loc[rid]
        lines.append(f"{rid},{ft * m.silicon_ttft_ms},{fp * m.silicon_tpot_ms},1.0,")
    lines.append(f"{ROWS[2]},,,,ValueError: not representable")  # not predicted: not compared
    preds.write_text("\n".join(lines) + "\n")
    out = tmp_path / "rows.csv"
    assert ca.main(["--predictions", str(preds), "--json", "--rows-out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = pd.read_csv(out)
    assert sorted(rows.id) == sorted(ROWS[:2]) and rows.both.all()
    overall = summary["overall"]
    assert overall["rows"] == overall["aic_rows"] == 2
    assert overall["aic_ttft_mape"] == pytest.approx((100 + 50) / 2)
    assert overall["aic_tpot_mape"] == pytest.approx((50 + 20) / 2)
    ttft = (100 * (rows.pred_ttft_ms - rows.ttft_ms).abs() / rows.ttft_ms).mean()
    tpot = (100 * (rows.pred_tpot_ms - rows.tpot_ms).abs() / rows.tpot_ms).mean()
    assert overall["rackplan_ttft_mape"] == pytest.approx(ttft)
    assert overall["rackplan_tpot_mape"] == pytest.approx(tpot)
    assert [(g["backend"], g["system"], g["mode"], g["rows"]) for g in summary["groups"]] == [
        ("trtllm", "h100_sxm", "agg", 2)]

    assert ca.main(["--predictions", str(preds)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("trtllm h100_sxm agg") and text[-1].startswith("overall")
    assert "2 rows both predict" in text[-1] and "aiconfigurator 75.0 %" in text[-1]


def test_missing_predictions_file_says_what_to_run(tmp_path, capsys):
    missing = tmp_path / "none.csv"
    assert ca.main(["--predictions", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and "benchmarks/aic_predict.py" in err[0]
