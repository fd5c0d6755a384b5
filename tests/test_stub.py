"""The type stub ``cpuformer/_core.pyi`` agrees with the compiled module ``cpuformer._core``: every
function, class, method and property of one is in the other, with the same argument names, kinds and
default values. mypy's stubtest does the comparison, in a subprocess that runs this file as a script.

stubtest reads a runtime signature with ``inspect.signature``, which fails on every pybind11 function
(pybind11 sets no ``__text_signature__``), and then silently checks nothing but presence. pybind11
writes each signature as the first line of the docstring instead
(``forward(self: cpuformer._core.EncoderModel, input_ids: object, ...) -> object``), so the script gives
stubtest those signatures, and fails if stubtest did not look at one of them."""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cpuformer as cf

# The directory holding the package under test (the source tree's python/ or site-packages), put
# first on the subprocess's PYTHONPATH so that stubtest imports that _core and reads its stub.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cf.__file__)))
ALLOWLIST = Path(__file__).with_name("stubtest_allowlist.txt")
# pybind11 names unnamed arguments arg0, arg1, ...; they cannot be passed by keyword.
UNNAMED_ARGUMENT = re.compile(r"arg\d+")
# Attributes pybind11 adds to every class: they are not part of cpuformer's interface.
PYBIND11_CLASS_INTERNALS = {"_pybind11_conduit_v1_"}
TIMEOUT = 600


def run_stubtest(module: str, environment: dict, directory: Path) -> subprocess.CompletedProcess:
    """stubtest on ``module`` run from ``directory`` (not the source tree: mypy also searches the
    working directory for packages)."""
    # Flags: none of stubtest's --ignore-* options, so a name missing from the stub, a positional-only
    # mismatch and an unused allowlist entry are all errors; --strict-type-check-only also makes a
    # stub-only private class an error unless it is marked @type_check_only.
    return subprocess.run([sys.executable, __file__, module, "--allowlist", str(ALLOWLIST), "--strict-type-check-only"],
                          capture_output=True, text=True, timeout=TIMEOUT, env=environment, cwd=directory)


def test_stub_matches_compiled_module(tmp_path):
    environment = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       MYPY_CACHE_DIR=str(tmp_path / "mypy_cache"))
    result = run_stubtest("cpuformer._core", environment, tmp_path)
    if result.returncode != 0:
        pytest.fail(f"cpuformer/_core.pyi disagrees with cpuformer._core (stubtest, exit code "
                    f"{result.returncode}):\n{result.stdout}{result.stderr}", pytrace=False)


def test_signature_read_from_a_pybind11_docstring():
    """The signature given to stubtest is the binding's: names, kinds and default values."""
    from cpuformer import _core

    signature = signature_from_docstring(_core.EncoderModel.forward)
    assert str(signature) == ("(self, input_ids, attention_mask=None, token_type_ids=None, return_pooler=False, "
                              "num_threads=0, skip_padding=False, first_only=False, pick=None)")
    assert [parameter.kind for parameter in signature.parameters.values()] == [
        inspect.Parameter.POSITIONAL_OR_KEYWORD] * 9
    signature = signature_from_docstring(_core.peak_gops)
    assert signature.parameters["dtype"].default == "float32"
    assert signature.parameters["seconds"].default == 0.3
    # Unnamed arguments are positional-only, as pybind11 matches keywords by name only.
    assert str(signature_from_docstring(_core.EncoderModel.hidden_size.fget)) == "(arg0, /)"


def test_unreadable_docstring_signature_is_an_error():
    class Function:
        __name__ = "f"
        __doc__ = "f(x: std::vector<int>) -> None\n"  # a C++ type pybind11 could not name in Python

    with pytest.raises(SignatureError, match=r"f\(x: std::vector<int>\) -> None"):
        signature_from_docstring(Function())


# ---- the script: stubtest with pybind11's docstring signatures ---------------------------------


class SignatureError(Exception):
    pass


def is_pybind11_function(runtime) -> bool:
    # builtin_function_or_method: a module function or a bound method; instancemethod: a method
    # looked up on its class (pybind11 wraps each one so that it binds self).
    return type(runtime).__name__ in ("builtin_function_or_method", "instancemethod")


def signature_from_docstring(runtime) -> inspect.Signature:
    """The signature pybind11 writes as the docstring's first line, without annotations (stubtest
    compares names, kinds and defaults; a stub's types are its own)."""
    name = runtime.__name__  # empty for a property's getter, whose docstring starts at "("
    first_line = (runtime.__doc__ or "").split("\n", 1)[0]
    if not first_line.startswith(name + "("):
        raise SignatureError(f"{name}: the docstring does not start with a pybind11 signature: {first_line!r}")
    if "Overloaded function." in (runtime.__doc__ or ""):
        raise SignatureError(f"{name}: overloaded bindings are not read yet; teach signature_from_docstring "
                             f"to give one signature per overload")
    try:
        definition = ast.parse(f"def function{first_line[len(name):]}: ...").body[0]
    except SyntaxError as error:
        raise SignatureError(f"{name}: the signature in the docstring is not Python ({error.msg}): "
                             f"{first_line}") from None
    assert isinstance(definition, ast.FunctionDef)
    arguments = definition.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(arguments.defaults)) + [
        default_value(node) for node in arguments.defaults]
    unnamed = [i for i, argument in enumerate(positional) if UNNAMED_ARGUMENT.fullmatch(argument.arg)]
    last_positional_only = max(unnamed + [len(arguments.posonlyargs) - 1])
    parameters = [
        inspect.Parameter(argument.arg,
                          inspect.Parameter.POSITIONAL_ONLY if i <= last_positional_only
                          else inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for i, (argument, default) in enumerate(zip(positional, defaults))]
    if arguments.vararg:
        parameters.append(inspect.Parameter(arguments.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        parameters.append(inspect.Parameter(argument.arg, inspect.Parameter.KEYWORD_ONLY,
                                            default=inspect.Parameter.empty if default is None
                                            else default_value(default)))
    if arguments.kwarg:
        parameters.append(inspect.Parameter(arguments.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def default_value(node: ast.expr):
    """A default as pybind11 wrote it (its repr); one that is not a literal is stubtest's
    UNREPRESENTABLE, whose value stubtest does not compare."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        import mypy.stubtest

        return mypy.stubtest.UNREPRESENTABLE


def pybind11_functions(module) -> dict:
    """{qualified name: function} of every function and method a pybind11 module defines."""
    found = {}
    for name, value in vars(module).items():
        if is_pybind11_function(value):
            found[f"{module.__name__}.{name}"] = value
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for member_name, member in vars(value).items():
                if is_pybind11_function(member) and member_name not in PYBIND11_CLASS_INTERNALS:
                    found[f"{module.__name__}.{name}.{member_name}"] = getattr(value, member_name)
    return found


def main(arguments: list) -> int:
    import importlib

    import mypy.stubtest

    # stubtest's hooks, replaced below; their absence (a mypy that reorganised stubtest) must fail
    # here rather than quietly check nothing.
    for hook in ("safe_inspect_signature", "_verify_metaclass", "test_stubs", "parse_options"):
        if not hasattr(mypy.stubtest, hook):
            print(f"error: mypy.stubtest.{hook} is gone in mypy {mypy.__version__}; adapt tests/test_stub.py")
            return 2

    options = mypy.stubtest.parse_options(arguments)
    expected = {}
    for name in options.modules:
        module = importlib.import_module(name)
        expected.update({id(function): qualified for qualified, function in pybind11_functions(module).items()})
    asked = set()
    inspect_signature = mypy.stubtest.safe_inspect_signature

    def safe_inspect_signature(runtime):
        signature = inspect_signature(runtime)
        if signature is None and is_pybind11_function(runtime):
            asked.add(id(runtime))
            signature = signature_from_docstring(runtime)
        return signature

    verify_metaclass = mypy.stubtest._verify_metaclass

    def _verify_metaclass(stub, runtime, object_path, **options):
        # Every pybind11 class has the metaclass pybind11_builtins.pybind11_type, which has no stub
        # to name in a class definition; any other metaclass difference is still reported.
        for error in verify_metaclass(stub, runtime, object_path, **options):
            if type(runtime).__name__ != "pybind11_type":
                yield error

    mypy.stubtest.safe_inspect_signature = safe_inspect_signature
    mypy.stubtest._verify_metaclass = _verify_metaclass
    try:
        exit_code = mypy.stubtest.test_stubs(options)
    except SignatureError as error:
        print(f"error: {error}")
        return 1
    # By identity: a lookup on the module or class returns the one object its dictionary holds.
    unchecked = sorted(qualified for identity, qualified in expected.items() if identity not in asked)
    if unchecked:
        print("error: stubtest did not check the signature of " + ", ".join(unchecked) +
              " (missing from the stub, or stubtest no longer asks for runtime signatures)")
        return 1
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
