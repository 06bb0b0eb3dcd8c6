"""The repr parser: every repr the package prints reads back to an equal value, and no text makes it
run code. `eval` appears here only on reprs the package itself printed (trusted), as the oracle."""
import builtins
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blueprint.optim as optim
from blueprint import BlockStyle, BluePrint, Kind, Layer, conv, relu, seq, zoo
from blueprint import ConfigError
from blueprint._parse import CONFIG_CLASSES, FACTORIES, parse_as, parse_value

from tests.null.test_dsl import DSL_NAMESPACE, RECIPES, build   # the DSL's tree strategy
from tests.null.test_optim_config import ALL_VALUES                # the config table

TRUSTED_NAMESPACE = {**DSL_NAMESPACE, **vars(optim)}
SENTINEL = Path(tempfile.mkdtemp(prefix="blueprint-parse-")) / "executed"
PAYLOADS = [
    f"__import__('pathlib').Path({str(SENTINEL)!r}).touch()",
    f"open({str(SENTINEL)!r}, 'w')",
    f"__import__('os').system('touch {SENTINEL}') or BluePrint(seq(relu()))",
    "exec('import os')",
    "eval('1')",
    "(lambda: 1)()",
    "[x for x in (1,)]",
    "SGD().__class__.__init__.__globals__",
    "conv.__globals__['__builtins__']",
    "BluePrint.__init__",
    "BlockStyle.__class__",
    "SGD().lr_at(0, 0, 1, 1.0, 1)",
    "conv(16, k=3)",
    "conv(16, 3) + conv(16, 3)",
    "f'{1}'",
    "seq(*[relu()])",
    "getattr(SGD(), 'lr')",
    "relu",
    "(relu, 1)",
    "SGD().lr",
    "conv(16, 3)(1)",
    "1 if True else 2",
    "seq(relu(),",
    "seq(relu()))",
    "'\\x'",
    "conv(0" + "0" * 8 + ", 3)",
    "conv(" + "9" * 5000 + ", 3)",
]


def _spy_on_code_execution():
    """Patch the builtins that compile or run code; returns the list of calls they saw."""
    calls = []
    real_compile = builtins.compile

    def compile_spy(source, filename, mode, flags=0, *args, **kwargs):
        if not flags & 0x400:   # ast.PyCF_ONLY_AST: parsing to a tree is not execution
            calls.append(("compile", source))
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    patches = [mock.patch.object(builtins, "compile", compile_spy),
               mock.patch.object(builtins, "eval", lambda *a, **k: calls.append(("eval", a))),
               mock.patch.object(builtins, "exec", lambda *a, **k: calls.append(("exec", a)))]
    return calls, patches


def _parse_without_executing(text):
    """parse_value(text) under the spies; asserts nothing was compiled, evaluated or touched."""
    calls, patches = _spy_on_code_execution()
    for patch in patches:
        patch.start()
    try:
        return parse_value(text)
    finally:
        for patch in patches:
            patch.stop()
        assert calls == [], f"parsing {text!r} executed code: {calls}"
        assert not SENTINEL.exists(), f"parsing {text!r} ran the payload"


def test_the_names_come_from_the_factory_table_and_the_config_module():
    assert set(FACTORIES) == {kind.value for kind in Kind}
    assert set(CONFIG_CLASSES) == set(optim.__all__)


@pytest.mark.parametrize("name", zoo.MODELS)
def test_every_zoo_model_reads_back(name):
    bp = zoo.MODELS[name].build()
    text = repr(bp)
    assert _parse_without_executing(text) == bp == eval(text, dict(TRUSTED_NAMESPACE))
    assert parse_as(text, "model", (BluePrint,)) == bp


@pytest.mark.parametrize("value", ALL_VALUES, ids=repr)
def test_every_config_reads_back(value):
    text = repr(value)
    again = _parse_without_executing(text)
    assert again == value == eval(text, dict(TRUSTED_NAMESPACE)) and type(again) is type(value)


@pytest.mark.parametrize("text, expected", [
    ("BluePrint()", BluePrint()),
    ("block(16, BlockStyle.RESNET_3_3)", eval("block(16, BlockStyle.RESNET_3_3)", dict(TRUSTED_NAMESPACE))),
    ("(1, -2.5e-3, 'a', None, True, [3, 4,])", (1, -2.5e-3, "a", None, True, [3, 4])),
    ("seq(\n  conv(8, 3, 1, 1),\n  relu(),\n)", seq(conv(8, 3, 1, 1), relu())),
])
def test_literals_and_layout_that_repr_can_print(text, expected):
    assert _parse_without_executing(text) == expected


def _payload_id(text):
    """The payload with its random temporary path replaced: pytest-xdist needs the same test ids on every worker."""
    return text.replace(str(SENTINEL), "<sentinel>")


@pytest.mark.parametrize("text", PAYLOADS, ids=_payload_id)
def test_anything_else_is_refused_quoting_the_text(text):
    with pytest.raises(ConfigError) as caught:
        _parse_without_executing(text)
    message = str(caught.value)
    assert "\n" not in message and text[:40].replace("\\", "\\\\").replace('"', '\\"') in message


def test_parse_as_refuses_the_wrong_kind_of_value():
    with pytest.raises(ConfigError, match="cannot read model .*expected BluePrint, got SGD"):
        parse_as("SGD()", "model", (BluePrint,))


def test_depth_is_not_limited_by_python_recursion():
    depth = 5000
    text = "seq(" * depth + "relu()" + ")" * depth
    layer = parse_value(text)
    for _ in range(depth - 1):
        layer = layer.children[0]
    assert layer == seq(relu())


# ---- properties --------------------------------------------------------------------------------
FRAGMENTS = st.sampled_from(list("(),.[]-'\"=+*_ 0123456789eEx\\") + [
    "__import__", "os", "system", "lambda", "__class__", "exec", "eval", "open", "relu()", "SGD()", "BlockStyle",
    "conv(", ".lr(", "True", "None", "10**9", PAYLOADS[0], PAYLOADS[1]])
VALID_TEXTS = st.one_of(RECIPES.map(lambda r: repr(BluePrint(build(r)))), st.sampled_from([repr(v) for v in ALL_VALUES]))


@st.composite
def mutated(draw):
    text = draw(VALID_TEXTS)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 3))
        text = text[:at] + draw(st.one_of(st.just(""), FRAGMENTS)) + text[at + cut:]
    return text


def _check_read_or_refused(text):
    try:
        value = _parse_without_executing(text)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    # accepted: the value must be one the DSL can print, and its own (trusted) repr must read back equal
    if isinstance(value, (Layer, BluePrint, BlockStyle, *CONFIG_CLASSES.values())):
        again = repr(value)
        assert parse_value(again) == value == eval(again, dict(TRUSTED_NAMESPACE))


@settings(max_examples=300, deadline=None)
@given(mutated())
def test_mutated_reprs_read_to_a_valid_value_or_are_refused(text):
    _check_read_or_refused(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_reads_to_a_valid_value_or_is_refused(text):
    _check_read_or_refused(text)


@settings(max_examples=100, deadline=None)
@given(VALID_TEXTS)
def test_valid_reprs_read_to_what_eval_gives(text):
    assert _parse_without_executing(text) == eval(text, dict(TRUSTED_NAMESPACE))


def teardown_module():
    if SENTINEL.exists():
        os.unlink(SENTINEL)
