"""Which oneDNN RNN layout a oneDNN release uses: the two places where older releases allocate more.

Both are in the CPU RNN primitive's size computations, and both were fixed later without changing
what the primitive computes, so the memory a PyTorch LSTM takes depends on the oneDNN its build
bundles (targets/onednn/version.py):

1. Workspace (``rnn_utils.cpp`` ``set_offsets``): older releases register ``ws_states_iter`` twice
   right after ``ws_states_layer``, then alias ``ws_states_iter_offset`` to
   ``ws_states_layer_offset``. The two registrations are never used but take their space, each
   page-rounded: ``ws_states_iter_size``, equal to ``ws_states_layer_size`` (asserted there).
   Newer releases only alias it (rnn_workspace.py).
2. Scratchpad (``ref_rnn.hpp`` ``pd_t::init_scratchpad``): older releases, besides
   ``key_rnn_space`` (which already holds scratch_gates, scratch_ht and scratch_diff_ht), book
   ``book<scratch_t>(key_rnn_gates, scratch_gates_size)``, ``book<ht_t>(key_rnn_ht,
   scratch_ht_size)`` and ``book<gemm_acc_t>(key_rnn_diff_ht, scratch_diff_ht_size)``. The sizes
   are bytes already, and ``book<T>`` multiplies by ``sizeof(T)`` again, so each costs its buffer
   times its element size, plus the registry's 128 bytes (scratchpad.py ``book``). Newer releases
   book none of the three (oneDNN's "cpu: rnn: remove unnecessary memory allocations", 2025,
   describes this size-in-bytes-as-elements booking).

Measured with the real ops (tests/test_onednn_rnn.py, run under the torch that bundles each
release): torch 2.6 (oneDNN 3.5.3) matches both older layouts on every f32 shape, byte for byte;
torch 2.13 (oneDNN 3.12.0) and 2.15 (oneDNN 3.13.3) match the newer ones. bf16 under 3.5 could
not be measured here (that CPU has no bf16 oneDNN): it follows the same source lines with its
element types. Which release between 3.5 and 3.12 changed each layout is not pinned down, so every
release outside the verified ones gets the older layouts, the larger (a bound, never low), and
``RnnLayout.exact`` says so.
"""

from __future__ import annotations

import dataclasses

from trainmem.targets.onednn.version import OneDnnVersion, bundled_onednn_version, version_text

# (major, minor) releases checked against the real op, by layout
_VERIFIED_OLDER = ((3, 5),)
_VERIFIED_NEWER = ((3, 12), (3, 13))


@dataclasses.dataclass(frozen=True)
class RnnLayout:
    """The oneDNN CPU RNN layout one release uses, and whether that was checked on the real op."""

    dead_states_registrations: bool  # 1. the two unused ws_states_iter registrations in the workspace
    typed_scratch_bookings: bool  # 2. key_rnn_gates / key_rnn_ht / key_rnn_diff_ht booked by element size
    exact: bool  # False: the release was not verified, and the older (larger) layout is a bound
    onednn: str  # "oneDNN 3.5.3", for messages

    def note(self) -> str:
        """One line for an estimate's warnings when the sizes are a bound, not verified numbers."""
        return (f"the oneDNN LSTM workspace and scratchpad are an upper bound, not exact: {self.onednn} was "
                "not checked against the real op (oneDNN 3.5, 3.12 and 3.13 were); its layout is taken as "
                "the larger, older one")


def rnn_layout(onednn_version: OneDnnVersion | None = None) -> RnnLayout:
    """The layout for ``onednn_version`` (default: the oneDNN of the running torch)."""
    version = bundled_onednn_version() if onednn_version is None else onednn_version
    release = None if version is None else version[:2]
    if release in _VERIFIED_NEWER:
        return RnnLayout(False, False, True, version_text(version))
    # verified on 3.5; anywhere else the older layout is the larger of the two known, never low
    return RnnLayout(True, True, release in _VERIFIED_OLDER, version_text(version))
