"""The generation-option rules shared by the Python and C APIs (csrc/models/request_checks.h,
bound as _core.check_generation_request): each rule's message, values written as Python's repr()
writes them, and the Python-only type checks worded with the same rules. The C API's side of the
same messages is tests/c/capi_tests.c."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpuformer import _core
from cpuformer.models.generator import option_integer, option_number

RULES = {"max_new_tokens": "an integer >= 0", "min_new_tokens": "an integer >= 0",
         "no_repeat_ngram_size": "an integer >= 0", "top_k": "an integer >= 0 (0 disables it)",
         "num_beams": "an integer >= 1", "temperature": "a finite number", "top_p": "a finite number",
         "repetition_penalty": "a finite number", "length_penalty": "a finite number"}


def test_the_rules():
    for name, rule in RULES.items():
        assert _core.generation_option_rule(name) == rule
    with pytest.raises(ValueError, match="^no generation option named 'seed'$"):
        _core.generation_option_rule("seed")
    _core.check_generation_request()  # the defaults are valid


@pytest.mark.parametrize("options,message", [
    (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0, got -1"),
    (dict(min_new_tokens=-5), "min_new_tokens must be an integer >= 0, got -5"),
    (dict(top_k=-1), r"top_k must be an integer >= 0 \(0 disables it\), got -1"),
    (dict(num_beams=0), "num_beams must be an integer >= 1, got 0"),
    (dict(no_repeat_ngram_size=-(2 ** 63)), "no_repeat_ngram_size must be an integer >= 0, got -9223372036854775808"),
    (dict(temperature=math.nan), "temperature must be a finite number, got nan"),
    (dict(top_p=math.inf), "top_p must be a finite number, got inf"),
    (dict(repetition_penalty=-math.inf), "repetition_penalty must be a finite number, got -inf"),
    (dict(length_penalty=math.nan), "length_penalty must be a finite number, got nan"),
    (dict(do_sample=True, temperature=0.0), r"temperature must be > 0 when sampling, got 0.0"),
    (dict(do_sample=True, temperature=-1e-300), r"temperature must be > 0 when sampling, got -1e-300"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    (dict(top_p=1.0000000000000002), r"top_p must be in \(0, 1\], got 1.0000000000000002"),
    (dict(repetition_penalty=-0.0), "repetition_penalty must be > 0, got -0.0"),
])
def test_each_rule_and_message(options, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        _core.check_generation_request(**options)


def test_beam_sampling_is_not_implemented():
    with pytest.raises(NotImplementedError, match=r"^beam sampling \(do_sample with num_beams > 1\) is not supported$"):
        _core.check_generation_request(do_sample=True, num_beams=2)
    _core.check_generation_request(do_sample=False, num_beams=2, temperature=0.0)  # temperature: sampling only


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, max_value=0.0))
def test_values_are_written_as_python_repr(value):
    with pytest.raises(ValueError) as error:
        _core.check_generation_request(repetition_penalty=value)
    message = str(error.value)
    wanted = "must be a finite number" if math.isinf(value) else "must be > 0"
    assert message == f"repetition_penalty {wanted}, got {value!r}"


def test_python_type_checks_use_the_rules():
    with pytest.raises(ValueError, match=r"^top_k must be an integer >= 0 \(0 disables it\), got '3'$"):
        option_integer("top_k", "3")
    with pytest.raises(ValueError, match=r"^num_beams must be an integer >= 1, got True$"):
        option_integer("num_beams", True)
    with pytest.raises(ValueError, match=r"^max_new_tokens must be an integer >= 0, got 1.5$"):
        option_integer("max_new_tokens", 1.5)
    huge = rf"^max_new_tokens must be an integer >= 0 and <= 2\*\*63 - 1, got {2 ** 63}$"
    with pytest.raises(ValueError, match=huge):
        option_integer("max_new_tokens", 2 ** 63)
    with pytest.raises(ValueError, match=r"^min_new_tokens must be an integer >= 0, got -"):
        option_integer("min_new_tokens", -(2 ** 70))
    assert option_integer("top_k", np.int64(-4)) == -4  # the range is the C++ check's
    with pytest.raises(ValueError, match=r"^temperature must be a finite number, got '1'$"):
        option_number("temperature", "1")
    with pytest.raises(ValueError, match=r"^top_p must be a finite number, got 1000"):
        option_number("top_p", 10 ** 400)
    assert option_number("top_p", np.float32(0.5)) == 0.5 and math.isinf(option_number("top_p", math.inf))
