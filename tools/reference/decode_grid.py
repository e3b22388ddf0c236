"""Reference decode grids from scipy, for the Clough-Tocher parity test.

Builds upstream's DecodeInterpolator grids (perf_interpolation.py: 100x100 griddata cubic with
nearest fill) for each built-in profile and writes a sample of cells to
crates/planner-core/tests/fixtures/scipy-decode-grids.json.

    python3 -m venv /tmp/sci && /tmp/sci/bin/pip install numpy scipy
    /tmp/sci/bin/python tools/reference/decode_grid.py
"""

import json
import pathlib

import numpy as np
import scipy
from scipy.interpolate import griddata

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILES = ["h200-llama3.1-8b-tp1", "h100-llama3.3-70b-tp8", "h100-llama3.3-70b-tp4", "h100-llama3.3-70b-tp2"]


def grids(path):
    d = np.load(path)
    x, y = d["x_kv_usage"], d["y_context_length"]
    xi = np.linspace(0, 1, 100)
    yi = np.linspace(0, y.max(), 100)
    X, Y = np.meshgrid(xi, yi)
    out = {}
    for name, z in (("itl", d["z_itl"]), ("thpt", d["z_thpt_per_gpu"])):
        g = griddata((x, y), z, (X, Y), method="cubic")
        g = np.where(np.isnan(g), griddata((x, y), z, (X, Y), method="nearest"), g)
        out[name] = g
    return out


def main():
    rng = np.random.default_rng(7)
    result = {"scipy": scipy.__version__, "profiles": {}}
    for name in PROFILES:
        g = grids(ROOT / "config/profiles" / name / "selected_decode_interpolation/raw_data.npz")
        cells = rng.choice(100 * 100, size=400, replace=False)
        result["profiles"][name] = [
            {"iy": int(c // 100), "ix": int(c % 100), "itl": float(g["itl"].flat[c]), "thpt": float(g["thpt"].flat[c])}
            for c in sorted(cells)
        ]
    out = ROOT / "crates/planner-core/tests/fixtures/scipy-decode-grids.json"
    out.write_text(json.dumps(result, indent=0) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
