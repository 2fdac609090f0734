"""The GPU-test harness's bookkeeping, with the server and the client stubbed."""

import threading
import time

import pytest

from sglang_adaptive import testing


@pytest.fixture
def fake_servers(monkeypatch):
    seen = {"ports": {}, "live": 0, "max_live": 0}
    lock = threading.Lock()

    class FakeServer:
        def __init__(self, label, args, env, port):
            self.label, self.args, self.port = label, args, port
            self.url = f"http://127.0.0.1:{port}"

        def start(self):
            if self.label == "broken":
                raise RuntimeError("server exited")
            with lock:
                seen["ports"][self.label] = self.port
                seen["live"] += 1
                seen["max_live"] = max(seen["max_live"], seen["live"])
            time.sleep(0.05)

        def stop(self):
            with lock:
                if self.label in seen["ports"]:
                    seen["live"] -= 1

        def log_text(self):
            return f"log of {self.label}"

    def fake_generate(url, reqs, concurrency):
        return [{"output_ids": [r, concurrency]} for r in reqs]

    monkeypatch.setattr(testing, "Server", FakeServer)
    monkeypatch.setattr(testing, "generate", fake_generate)
    return seen


CONFIGS = {"a": (["--x"], {}, 1), "b": ([], {}, 2), "c": ([], {}, 3), "broken": ([], {}, 4)}


@pytest.mark.parametrize("parallel", [1, 3])
def test_every_configuration_runs_once_in_order(fake_servers, parallel):
    runs = testing.run_configs(CONFIGS, [10, 11], parallel=parallel)
    assert list(runs) == list(CONFIGS)
    assert runs["b"].ids == [[10, 2], [11, 2]] and runs["b"].log == "log of b"
    assert runs["broken"].error == "server exited" and runs["broken"].results is None
    # One port per configuration, so overlapping servers never collide.
    assert len(set(fake_servers["ports"].values())) == 3
    assert fake_servers["max_live"] == min(parallel, 3)
