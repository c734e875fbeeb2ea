import pytest

from sbx_sandbox import CodeContext, Execution, errors


def test_python_value_and_logs(sandbox):
    e = sandbox.run_code("1 + 1")
    assert isinstance(e, Execution)
    assert e.text == "2" and e.results[0].is_main_result and e.error is None
    e = sandbox.run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)\nx = 5")
    assert "".join(e.logs.stdout) == "out\n" and "".join(e.logs.stderr) == "err\n"
    assert sandbox.run_code("x * 2").text == "10"  # state persists in the default context


def test_python_error(sandbox):
    e = sandbox.run_code("1/0")
    assert e.error is not None and e.error.name == "ZeroDivisionError"
    assert "division by zero" in e.error.value and e.error.traceback


def test_matplotlib_png(sandbox):
    ctx = sandbox.create_code_context("python")
    try:
        e = sandbox.run_code("import matplotlib.pyplot as plt\n"
                             "plt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()",
                             context=ctx, timeout=60000)
        assert e.error is None, e.error
        pngs = [r for r in e.results if r.png]
        assert pngs, e.results
        assert pngs[0].png_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "image/png" in pngs[0].formats
    finally:
        sandbox.delete_code_context(ctx)


def test_javascript(sandbox):
    e = sandbox.run_code("const a = [1, 2, 3].map(x => x * 2); console.log('js'); a",
                         language="javascript")
    assert e.error is None and e.text == "[ 2, 4, 6 ]" and e.results[0].json == [2, 4, 6]
    assert "".join(e.logs.stdout) == "js\n" and e.language == "javascript"


def test_contexts(sandbox):
    ctx = sandbox.create_code_context("python", env_vars={"CTX_VAR": "v1"})
    assert isinstance(ctx, CodeContext) and ctx.language == "python"
    try:
        assert sandbox.run_code("import os; os.environ['CTX_VAR']", context=ctx).text == "'v1'"
        sandbox.run_code("y = 3", context=ctx.id)
        assert sandbox.run_code("y", context=ctx).text == "3"
        assert ctx.id in [c.id for c in sandbox.list_code_contexts()]
    finally:
        sandbox.delete_code_context(ctx)
    with pytest.raises(errors.ContextNotFound):
        sandbox.run_code("1", context=ctx)
    with pytest.raises(errors.ValidationFailed):
        sandbox.create_code_context("cobol")


def test_run_code_stream(sandbox):
    events = list(sandbox.run_code_stream("print(1)\nprint(2)\n40 + 2"))
    types = [e["type"] for e in events]
    assert types[0] == "start" and types[-1] == "execution_complete"
    assert "".join(e["text"] for e in events if e["type"] == "stdout") == "1\n2\n"
    assert [e["result"]["text"] for e in events if e["type"] == "result"] == ["42"]
