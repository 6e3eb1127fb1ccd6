"""Reports of runs at the edges: a search that found nothing that fits while a one-shot placer did."""

import json
import subprocess
import sys

import postplace
from postplace.graph import OpGraph
from postplace.report import write_report

# A CPU with room for everything and two GPUs too small for any one op: every placement that uses a GPU
# is OOM, so the random search (12 ops, 3 devices, 4 samples, seed 0) finds nothing that fits, while the
# single device (the CPU) and the one-shot placers that keep to it do.
CLUSTER_TOML = """
name = "tiny-gpus"
[[device]]
name = "cpu"
kind = "cpu"
model = "X"
peak_flops = 1e11
memory_bandwidth = 1e10
memory = 1e12
[[device]]
names = ["gpu0", "gpu1"]
kind = "gpu"
model = "G"
peak_flops = 1e12
memory_bandwidth = 1e11
memory = 1e6
[[switch]]
name = "sw"
[[link]]
a = "cpu"
b = "sw"
bandwidth = 1e10
latency = 1e-6
[[link]]
a = "gpu0"
b = "sw"
bandwidth = 1e10
latency = 1e-6
[[link]]
a = "gpu1"
b = "sw"
bandwidth = 1e10
latency = 1e-6
"""


def chain(n: int = 12) -> OpGraph:
    return OpGraph.build([f"op{i}" for i in range(n)], [(i, i + 1, 1e6) for i in range(n - 1)],
                         flops=[1e9] * n, bytes_accessed=[1e6] * n, output_bytes=[1e7] * n,
                         persistent_bytes=[1e7] * n, name="chain")  # fmt: skip


def no_feasible_sample(folder) -> bool:
    return all(json.loads(line)["oom"] or json.loads(line)["failed"]
               for line in (folder / "history.jsonl").read_text().splitlines())  # fmt: skip


def test_a_search_with_no_feasible_sample_still_gets_its_report(tmp_path):
    (tmp_path / "c.toml").write_text(CLUSTER_TOML)
    out = tmp_path / "run"
    r = postplace.place(chain(), str(tmp_path / "c.toml"), strategy="random", budget=4, out=out,
                        groups=None)  # fmt: skip
    assert no_feasible_sample(out) and r.summary["search_best_step_time_s"] is None
    assert (out / "placement.json").exists()  # a placer's answer
    path = write_report(out, graph=r.graph, cluster=r.cluster)
    assert path.exists() and (out / "curves_wall.png").exists() and (out / "curves_samples.png").exists()
    html = path.read_text()
    assert "no feasible sample" in html


def test_place_through_the_cli_writes_the_report_when_only_a_placer_fits(tmp_path):
    (tmp_path / "c.toml").write_text(CLUSTER_TOML)
    chain().save(tmp_path / "chain.json")
    r = subprocess.run([sys.executable, "-m", "postplace.cli", "place", "chain.json", "-c", "c.toml", "--strategy",
                        "random", "--budget", "4", "--groups", "none", "--out", "run"], cwd=tmp_path,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert no_feasible_sample(tmp_path / "run")
    assert (tmp_path / "run" / "placement.json").exists() and (tmp_path / "run" / "report.html").exists()
