"""benchmarks/arm_instruction_model.py's arithmetic: naming the encodings QEMU 7.2 cannot
disassemble, the classes and the core model's cycles, and the check scripts/test-aarch64.sh runs
(which runs the plugin and the probe themselves under QEMU)."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model():
    spec = importlib.util.spec_from_file_location("arm_instruction_model",
                                                  os.path.join(ROOT, "benchmarks", "arm_instruction_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _enc(word):
    """The plugin's key for an encoding: the word without Rd, Rn, Rm."""
    return f"enc {word & ~(0x1F | 0x1F << 5 | 0x1F << 16):08x}"


def test_unnamed_encodings_are_named():
    m = _model()
    # sdot v3.4s, v4.16b, v5.16b; sdot v0.4s, v1.16b, v2.4b[3] (L = H = 1); smmla v7.4s, v8.16b, v9.16b
    assert m.name_of(_enc(0x4E809400 | 5 << 16 | 4 << 5 | 3)) == "sdot v.4s"
    assert m.name_of(_enc(0x4F80E000 | 1 << 21 | 1 << 11 | 2 << 16 | 1 << 5)) == "sdot v.4s"
    assert m.name_of(_enc(0x4E80A400 | 9 << 16 | 8 << 5 | 7)) == "smmla v.4s"
    assert m.name_of(_enc(0x4E809C00)) == "usdot v.4s"  # differs from sdot in bit 11 only
    assert m.name_of("enc 12345000") == "enc 12345000"
    assert m.name_of("fmla v.4s") == "fmla v.4s"
    assert m.named({_enc(0x4E809400): 3, _enc(0x4F80E000): 2, "ldr q": 1}) == {"sdot v.4s": 5, "ldr q": 1}


def test_classes_and_cycles():
    m = _model()
    counts = {"fmla v.4s": 100, "fcvtl v.4s": 10, "ldr q": 60, "str q": 5, "add x": 20, "b.ne": 5}
    c = m.classify(counts)
    assert c == {"total": 200, "mac": 100, "vector": 110, "load": 60, "store": 5, "other": 25}
    core = dict(decode=4, vector_pipes=2, load_pipes=2, throughput={"fcvtl": 0.5})
    assert m.cycles(counts, core) == pytest.approx(max(100 / 2 + 10 / 0.5, 60 / 2, 200 / 4))
    assert m.cycles({"ldr q": 300, "fmla v.4s": 10}, core) == pytest.approx(150)  # load-bound


def test_check_names_a_level_that_does_not_use_its_instructions():
    m = _model()
    rows = [{"workload": "int8 gemm 64x512x512", "level": "dotprod", "mac_instruction_share": 1.0},
            {"workload": "int8 gemm 64x512x512", "level": "neon", "mac_instruction_share": 0.0},
            {"workload": "float32 gemm 64x512x512", "level": "neon", "mac_instruction_share": 1.0},
            {"workload": "int8 gemv 1x2048x2048", "level": "i8mm", "mac_instruction_share": 2.0},
            {"workload": "int8 gemm 64x512x512", "level": "i8mm", "mac_instruction_share": 1.0},
            {"workload": "attention decode 1x512", "level": "neon", "mac_instruction_share": 0.5}]
    assert m.check(rows) == []
    rows[0]["mac_instruction_share"] = 0.0
    rows[2]["mac_instruction_share"] = 0.5
    rows[3]["mac_instruction_share"] = 1.0  # one row through SMMLA must cost two rows' multiply-adds
    failures = m.check(rows)
    assert len(failures) == 3 and "int8 gemm 64x512x512 at dotprod" in failures[0]
    assert "int8 gemv 1x2048x2048 at i8mm" in failures[2]
