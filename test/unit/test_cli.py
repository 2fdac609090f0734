import subprocess
import sys


def test_launch_server_help_lists_the_flags():
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in (
        "--speculative-disable-batch-threshold N",
        "--speculative-switch-policy {off,threshold,alternate,goodput}",
        "--speculative-cost-table-path PATH",
        "--speculative-switch-alternate-period K",
    ):
        assert flag in out.stdout
