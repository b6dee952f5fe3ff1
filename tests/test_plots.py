"""Tests of natgrad_diag.pictures: the data each picture draws, checked against independent oracles.

Oracles: the Jacobian built here with ``tf.GradientTape.jacobian`` and reshaped by hand, central finite
differences of a numpy Cholesky (``np_meanvarsqrt``), explicit numpy contractions of that Jacobian.
"""

from __future__ import annotations

import io
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from natgrad_diag import pictures as plots
from natgrad_diag.exceptions import InputError, MissingExtraError
from natgrad_diag.autodiff.blocks import BlockJacobian
from natgrad_diag.report.base import Report
from natgrad_diag.report.records import Check, Section
from tests.conftest import np_meanvarsqrt, random_q

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _eta(M: int, L: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    q_mu, q_sqrt = random_q(M, L, seed=seed)
    eta2 = np.einsum("lij,lkj->lik", q_sqrt, q_sqrt) + np.einsum("il,kl->lik", q_mu, q_mu)
    return q_mu, eta2


def _tape_block_jacobian(eta1: np.ndarray, eta2: np.ndarray) -> BlockJacobian:
    """J of GPflow's expectation_to_meanvarsqrt, built here with tape.jacobian (not natgrad_diag.autodiff.dense)."""
    import tensorflow as tf
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

    e1, e2 = tf.constant(eta1), tf.constant(eta2)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([e1, e2])
        mean, varsqrt = expectation_to_meanvarsqrt(e1, e2)
    zero = tf.UnconnectedGradients.ZERO
    blocks = tuple(tuple(tape.jacobian(y, x, unconnected_gradients=zero).numpy() for x in (e1, e2)) for y in (mean, varsqrt))
    del tape
    return BlockJacobian(
        blocks, ("mean", "varsqrt"), ("eta1", "eta2"),
        (tuple(eta1.shape), tuple(eta2.shape)), (tuple(eta1.shape), tuple(eta2.shape)),
    )  # fmt: skip


def _fd_varsqrt_eta1(eta1: np.ndarray, eta2: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """∂varsqrt/∂eta1 by central differences of the numpy oracle, flattened to [L·M·M, M·L]."""
    cols = []
    for idx in np.ndindex(*eta1.shape):
        plus, minus = eta1.copy(), eta1.copy()
        plus[idx] += h
        minus[idx] -= h
        cols.append(((np_meanvarsqrt(plus, eta2)[1] - np_meanvarsqrt(minus, eta2)[1]) / (2 * h)).ravel())
    return np.stack(cols, axis=1)


@pytest.fixture(scope="module")
def explanation():
    """An explanation with L = 2 latent GPs (so the [M, L] flattening order matters)."""
    from natgrad_diag import explain_output_gradients

    q_mu, q_sqrt = random_q(3, 2, seed=5)
    rng = np.random.default_rng(6)
    return explain_output_gradients((q_mu, q_sqrt, rng.normal(size=q_mu.shape), np.tril(rng.normal(size=q_sqrt.shape))))


@dataclass(frozen=True)
class _Numbers(Report):
    """A report with hand-picked checks: zero, passing, failing, must-differ, non-numeric."""

    title: str = "numbers"
    checks: tuple[Check, ...] = (
        Check("zero_error", "exact", True, 0.0, 1e-12),
        Check("small_error", "close", True, 3e-14, 1e-12),
        Check("too_large", "not close", False, 2e-3, 1e-8),
        Check("must_differ", "differs", True, 0.4, 1e-10, expect_difference=True),
        Check("no_numbers", "a structural fact", True),
    )

    def sections(self) -> tuple[Section, ...]:
        return (Section("s", "text"),)


# --------------------------------------------------------------------------------------------------
# (1) the heatmap's data


@pytest.mark.parametrize("M, L", [(3, 1), (2, 2)], ids=["M3-L1", "M2-L2"])
def test_heatmap_data__structure_matches_tape_jacobian(M, L):
    eta1, eta2 = _eta(M, L, seed=M + 7 * L)
    J = _tape_block_jacobian(eta1, eta2)
    data = plots.heatmap_data(J)

    n1, n2 = M * L, L * M * M
    assert data.matrix.shape == (n1 + n2, n1 + n2)
    assert data.row_blocks == (
        plots.BlockSpan("mean", (M, L), 0, n1),
        plots.BlockSpan("varsqrt", (L, M, M), n1, n1 + n2),
    )
    assert data.col_blocks == (
        plots.BlockSpan("eta1", (M, L), 0, n1),
        plots.BlockSpan("eta2", (L, M, M), n1, n1 + n2),
    )
    # every block is the tape's block reshaped by hand
    for i, (out, n_out) in enumerate((("mean", n1), ("varsqrt", n2))):
        for j, (inp, n_in) in enumerate((("eta1", n1), ("eta2", n2))):
            np.testing.assert_array_equal(data.block(out, inp), J.blocks[i][j].reshape(n_out, n_in))
    # the structure the picture is about
    assert np.all(data.block("mean", "eta2") == 0.0)
    np.testing.assert_array_equal(data.block("mean", "eta1"), np.eye(n1))
    vs_eta1 = data.block("varsqrt", "eta1")
    assert np.max(np.abs(vs_eta1)) > 0.1
    np.testing.assert_allclose(vs_eta1, _fd_varsqrt_eta1(eta1, eta2), rtol=0, atol=1e-7)
    assert data.row_labels[n1] == "varsqrt[0,0,0]" and data.col_labels[n1 - 1] == f"eta1[{M - 1},{L - 1}]"


def test_heatmap_data__of_explanation_is_its_jacobian(explanation):
    e1, e2 = explanation.trace.eta1, explanation.trace.eta2
    independent = plots.heatmap_data(_tape_block_jacobian(e1, e2))
    data = plots.heatmap_data(explanation.jacobian)
    np.testing.assert_allclose(data.matrix, independent.matrix, rtol=0, atol=1e-12)
    assert data.row_blocks == independent.row_blocks and data.col_blocks == independent.col_blocks


@given(
    out_shapes=st.lists(st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple), min_size=1, max_size=3),
    in_shapes=st.lists(st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_heatmap_data__spans_partition_the_matrix(out_shapes, in_shapes, seed):
    rng = np.random.default_rng(seed)
    blocks = tuple(tuple(rng.normal(size=o + i) for i in in_shapes) for o in out_shapes)
    names_out = tuple(f"y{k}" for k in range(len(out_shapes)))
    names_in = tuple(f"x{k}" for k in range(len(in_shapes)))
    data = plots.heatmap_data(BlockJacobian(blocks, names_out, names_in, tuple(out_shapes), tuple(in_shapes)))

    sizes_out = [int(np.prod(s)) for s in out_shapes]
    sizes_in = [int(np.prod(s)) for s in in_shapes]
    assert data.matrix.shape == (sum(sizes_out), sum(sizes_in))
    assert [s.start for s in data.row_blocks] == list(np.cumsum([0] + sizes_out[:-1]))
    assert data.row_blocks[-1].stop == sum(sizes_out) and data.col_blocks[-1].stop == sum(sizes_in)
    for i, o in enumerate(names_out):
        for j, x in enumerate(names_in):
            np.testing.assert_array_equal(data.block(o, x), blocks[i][j].reshape(sizes_out[i], sizes_in[j]))


def test_heatmap_data__bad_input_names_the_argument():
    with pytest.raises(InputError) as info:
        plots.heatmap_data(np.eye(3))
    assert str(info.value) == (
        "Invalid input. the heatmap needs the explicit Jacobian.\n"
        "  Argument: jacobian\n"
        "    Expected: a natgrad_diag.BlockJacobian\n"
        "    Got:      ndarray\n"
        "  To fix: pass natgrad_diag.jacobian(...) or natgrad_map_jacobian(eta1, eta2), e.g. Explanation.jacobian."
    )
    J = _tape_block_jacobian(*_eta(2, 1, seed=0))
    with pytest.raises(InputError, match="no output named 'mu'"):
        plots.heatmap_data(J).block("mu", "eta1")


def test_plot_jacobian_heatmap__draws_the_data_with_block_lines_and_labels():
    eta1, eta2 = _eta(3, 1, seed=2)
    J = _tape_block_jacobian(eta1, eta2)
    fig = plots.plot_jacobian_heatmap(J)
    ax = fig.axes[0]
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), J.matrix)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mean [3, 1]", "varsqrt [1, 3, 3]"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["eta1 [3, 1]", "eta2 [1, 3, 3]"]
    # one horizontal and one vertical boundary, both between element 2 and 3
    boundaries = sorted({round(float(v), 6) for line in ax.lines for v in np.ravel(line.get_data())} - {0.0, 1.0})
    assert boundaries == [2.5]
    assert any("all 0" in t.get_text() and "mean/∂eta2" in t.get_text() for t in ax.texts)


# --------------------------------------------------------------------------------------------------
# (2) the eta1 chart's data


def test_eta1_comparison_data__series_match_an_explicit_contraction(explanation):
    t = explanation.trace
    M, L = t.eta1.shape
    J = _tape_block_jacobian(t.eta1, t.eta2)
    mean_path = np.einsum("ab,abcd->cd", t.dL_dmean, J.blocks[0][0])
    varsqrt_path = np.einsum("abc,abcde->de", t.dL_dvarsqrt, J.blocks[1][0])
    ones_seed = np.einsum("ab,abcd->cd", np.ones_like(t.dL_dmean), J.blocks[0][0]) + np.einsum(
        "abc,abcde->de", np.ones_like(t.dL_dvarsqrt), J.blocks[1][0]
    )
    data = plots.eta1_comparison_data(explanation)

    assert data.labels == tuple(f"eta1[{m},{l}]" for m in range(M) for l in range(L))
    for k, label in enumerate(data.labels):
        m, l = (int(v) for v in label[5:-1].split(","))
        np.testing.assert_allclose(data.mean_path[k], mean_path[m, l], rtol=0, atol=1e-12)
        np.testing.assert_allclose(data.varsqrt_path[k], varsqrt_path[m, l], rtol=0, atol=1e-12)
        np.testing.assert_allclose(data.vjp[k], mean_path[m, l] + varsqrt_path[m, l], rtol=0, atol=1e-12)
        np.testing.assert_allclose(data.naive[k], ones_seed[m, l] * t.dL_dmean[m, l], rtol=0, atol=1e-12)
    assert np.max(np.abs(data.naive - data.vjp)) > 1e-3  # the picture shows a real difference


def test_plot_eta1_comparison__one_chart_per_element_with_the_four_bars(explanation):
    data = plots.eta1_comparison_data(explanation)
    fig = plots.plot_eta1_comparison(explanation)
    assert len(fig.axes) == len(data.labels) == 6
    for k, ax in enumerate(fig.axes):
        heights = [p.get_height() for p in ax.patches]
        np.testing.assert_allclose(heights, [data.vjp[k], data.naive[k], data.mean_path[k], data.varsqrt_path[k]], rtol=0, atol=0)
        assert ax.get_title() == data.labels[k]
    fig = plots.plot_eta1_comparison(explanation, max_charts=4)
    assert len(fig.axes) == 4 and "first 4 of 6" in fig.get_suptitle()


def test_plot_eta1_comparison__bad_input_is_refused(explanation):
    with pytest.raises(InputError, match="Argument: report"):
        plots.eta1_comparison_data(_Numbers())
    with pytest.raises(InputError, match="Argument: max_charts"):
        plots.plot_eta1_comparison(explanation, max_charts=0)


# --------------------------------------------------------------------------------------------------
# (3) errors against tolerances


def test_check_errors_data__keeps_numeric_checks_in_order():
    rows = plots.check_errors_data(_Numbers())
    assert [r.name for r in rows] == ["zero_error", "small_error", "too_large", "must_differ"]
    assert rows[2] == plots.CheckError("too_large", 2e-3, 1e-8, False, False)
    assert rows[3].expect_difference


def test_plot_check_errors__bars_end_at_the_errors_on_a_log_axis():
    fig = plots.plot_check_errors(_Numbers())
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    floor = ax.get_xlim()[0]
    assert floor < 3e-14
    right = [p.get_x() + p.get_width() for p in ax.patches]
    np.testing.assert_allclose(right, [floor, 3e-14, 2e-3, 0.4], rtol=1e-12)
    colours = [p.get_facecolor()[:3] for p in ax.patches]
    assert colours[2] != colours[1]  # the failing check is drawn differently
    ticks = [line.get_xdata()[0] for line in ax.lines]
    assert ticks == [1e-12, 1e-12, 1e-8, 1e-10]
    top_down = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
    assert [label for _, label in top_down] == ["zero_error", "small_error", "too_large", "must_differ"]


def test_plot_check_errors__no_numeric_check_is_refused():
    @dataclass(frozen=True)
    class Bare(Report):
        title: str = "bare"
        checks: tuple[Check, ...] = (Check("structural", "a fact", True),)

        def sections(self):
            return ()

    with pytest.raises(InputError, match="no numeric check"):
        plots.plot_check_errors(Bare())
    assert plots.report_pictures(Bare()) == ()


# --------------------------------------------------------------------------------------------------
# dispatch, PNG, read-only, missing matplotlib


def test_report_pictures__dispatch_by_what_the_report_has(explanation):
    assert plots.picture_kinds(explanation) == ("jacobian", "eta1", "checks")
    assert plots.picture_kinds(_Numbers()) == ("checks",)
    import matplotlib.image

    pictures = explanation.figures()
    assert [p.name for p in pictures] == ["jacobian", "eta1", "checks"]
    for p in pictures:
        assert p.png.startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(io.BytesIO(p.png), format="png")
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_report_pictures__leave_the_report_bit_identical(explanation):
    t = explanation.trace
    before = {k: np.copy(getattr(t, k)) for k in ("eta1", "eta2", "dL_deta1", "dL_dmean", "dL_dvarsqrt")}
    matrix = np.copy(explanation.jacobian.matrix)
    paths = [np.copy(explanation.mean_path), np.copy(explanation.varsqrt_path), np.copy(explanation.naive_product)]
    plots.report_pictures(explanation)
    for k, v in before.items():
        assert np.array_equal(getattr(t, k), v), k
    assert np.array_equal(explanation.jacobian.matrix, matrix)
    for a, b in zip(paths, (explanation.mean_path, explanation.varsqrt_path, explanation.naive_product)):
        assert np.array_equal(a, b)


def test_report_pictures__draw_without_warnings(explanation):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plots.report_pictures(explanation)
    assert [str(w.message) for w in caught] == []  # e.g. no "Glyph ... missing from font"


def test_require_matplotlib__missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError) as info:
        plots.require_matplotlib()
    assert isinstance(info.value, ImportError)
    assert str(info.value) == (
        "Optional dependency missing. pictures need matplotlib, which is not installed.\n"
        "  Extra:    plot\n"
        "    Expected: matplotlib importable\n"
        "    Got:      ImportError\n"
        '  To fix: pip install "natgrad-diag[plot]"  (or pip install matplotlib); the text report works without it.'
    )
    with pytest.raises(MissingExtraError, match=r"natgrad-diag\[plot\]"):
        plots.report_pictures(_Numbers())
    J = _tape_block_jacobian(*_eta(2, 1, seed=1))
    with pytest.raises(MissingExtraError):
        plots.plot_jacobian_heatmap(J)
    assert plots.heatmap_data(J).matrix.shape == (6, 6)  # the data needs no matplotlib


def test_plot_check_errors__non_finite_errors_fill_the_axis_and_read_as_failures():
    @dataclass(frozen=True)
    class NonFinite(Report):
        title: str = "non-finite"
        checks: tuple[Check, ...] = (
            Check("nan_error", "x", False, float("nan"), 1e-8),
            Check("inf_error", "x", False, float("inf"), 1e-8),
            Check("fine", "x", True, 1e-9, 1e-8),
        )

        def sections(self):
            return ()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.plot_check_errors(NonFinite())
        png = plots.figure_to_png(fig)
    assert png.startswith(PNG_SIGNATURE)
    ax = fig.axes[0]
    right = [p.get_x() + p.get_width() for p in ax.patches]
    assert right[0] == right[1] > 1e-8 and right[2] == pytest.approx(1e-9, rel=1e-12)
    labels = [t.get_text() for t in ax.texts]
    assert labels[:2] == ["nan > 1.00e-08", "inf > 1.00e-08"] and labels[2] == "1.00e-09 ≤ 1.00e-08"
