"""rlgen in a real Jupyter kernel (jupyter_client): the kernel's loop is running, "Interrupt kernel"
sends SIGINT, and "kill" gives no chance to clean up. The tutorials themselves are executed by
nbmake: `scripts/test.sh` (and so CI) runs `pytest tests notebooks --nbmake --nbmake-timeout=600`,
which picks up every notebook in notebooks/ (01_quickstart to 08_reward_across_a_run), each within 600 s and
each failing on the first lesson `assert` that does not hold. On a 2-core CPU machine shared with
other jobs, 06_multi_turn took about 2 minutes (three episode runs of 16-32 episodes).
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

jupyter_client = pytest.importorskip("jupyter_client")

pytestmark = pytest.mark.slow


class Kernel:
    def __init__(self) -> None:
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, *, timeout: float = 120, interrupt_after: float | None = None) -> dict:
        """Execute `code`; return {"status", "ename", "stdout", "result"}."""
        msg_id = self.kc.execute(code)
        out = {"status": None, "ename": None, "stdout": "", "result": None}
        t0 = time.monotonic()
        interrupted = False
        while True:
            if interrupt_after is not None and not interrupted and time.monotonic() - t0 > interrupt_after:
                self.km.interrupt_kernel()
                interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except Exception:  # queue.Empty
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"cell did not finish in {timeout} s: {code!r}") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                out["stdout"] += content["text"]
            elif kind == "execute_result":
                out["result"] = content["data"].get("text/plain")
            elif kind == "error":
                out["ename"] = content["ename"]
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = self.kc.get_shell_msg(timeout=10)
        out["status"] = reply["content"]["status"]
        return out

    def shutdown(self) -> None:
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel():
    k = Kernel()
    yield k
    k.shutdown()


@pytest.mark.timeout(300)
def test_generate_works_in_a_kernel_and_an_interrupt_leaves_the_engine_usable(kernel: Kernel, model_path: str) -> None:
    # 1) Start an engine in the kernel; its loop is running (asyncio.get_running_loop() succeeds in a cell).
    started = kernel.run(
        "import asyncio, rlgen\n"
        f"eng = rlgen.Engine({model_path!r}, backend='cpu', progress=False)\n"
        "print(asyncio.get_running_loop().is_running(), eng.info['pid'])"
    )
    assert started["status"] == "ok", started
    loop_running, server_pid = started["stdout"].split()
    assert loop_running == "True"
    # 2) A plain synchronous generate() in a cell.
    ok = kernel.run("print(eng.generate('Hi', max_new_tokens=3, ignore_eos=True).df.completion_tokens.tolist())")
    assert ok["stdout"].strip() == "[3]", ok
    # 3) Interrupt a long generate: KeyboardInterrupt, promptly, and the server survives.
    t0 = time.monotonic()
    interrupted = kernel.run("eng.generate(['Tell me a long story.'] * 2, max_new_tokens=4000, ignore_eos=True)",
                             interrupt_after=2.0)
    assert interrupted["ename"] == "KeyboardInterrupt", interrupted
    assert time.monotonic() - t0 < 20
    assert psutil.pid_exists(int(server_pid))
    # 4) The next cell still generates, and the interrupted rows were kept as aborted.
    again = kernel.run("print(eng.last_result.df.finish_reason.tolist(), "
                       "eng.generate('Hi', max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist())")
    assert again["stdout"].strip() == "['abort', 'abort'] [2]", again
    kernel.run("eng.close()")


@pytest.mark.timeout(300)
def test_killing_the_kernel_leaves_no_server_behind(kernel: Kernel, model_path: str) -> None:
    started = kernel.run(f"import rlgen\neng = rlgen.Engine({model_path!r}, backend='cpu', progress=False)\nprint(eng.info['pid'])")
    server = psutil.Process(int(started["stdout"]))
    os.kill(kernel.km.provisioner.process.pid, signal.SIGKILL)  # no atexit, no finalizers run in the kernel
    _, alive = psutil.wait_procs([server], timeout=20)
    assert not alive, "the server outlived its killed kernel"
