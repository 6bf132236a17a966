"""Size of the oneDNN (MKL-DNN) LSTM *workspace* that PyTorch keeps alive for backward on CPU.

Why this exists
---------------
On CPU, ``nn.LSTM`` in grad mode runs ``aten.mkldnn_rnn_layer`` once per (layer, direction).
Its 4th output is a ``uint8`` workspace tensor that autograd saves for
``mkldnn_rnn_layer_backward``. PyTorch's meta kernel (``torch/_meta_registrations.py``,
``mkldnn_rnn_layer``) returns a workspace with 0 elements, so a fake-tensor trace undercounts
memory. The real kernel (``aten/src/ATen/native/mkldnn/RNN.cpp``, ``mkldnn_rnn_layer``) allocates
``ideep::lstm_forward_training::prepare(...).workspace_desc().get_size()`` bytes, but only when
``at::GradMode::is_enabled()``. Otherwise it returns an undefined tensor (no workspace). The
``train`` argument of the op has no effect on this.

How PyTorch calls the primitive (RNN.cpp, ``mkldnn_rnn``)
----------------------------------------------------------
* One primitive per layer and per direction: ``n_layer = 1``, ``n_dir = 1``. The backward
  direction of a bidirectional LSTM is a separate call with ``reverse=True``, which becomes
  ``unidirectional_right2left`` and gives the same workspace size. The op's ``bidirectional``
  argument is only used for an output size that ``mkldnn_rnn_layer`` ignores, so it does not
  change the workspace.
* src_layer is ``[T, B, I]`` in ``tnc`` layout. The op always treats dim 0 as T, even when its
  ``batch_first`` flag is set (``mkldnn_rnn`` has already transposed). For layers after the first,
  ``I`` is ``H``, or ``2*H`` when bidirectional.
* Cell kind is ``vanilla_lstm`` with 4 gates and 2 states, no projection and no peephole.
  PyTorch always passes a bias; ``has_biases=False`` passes zeros.

Where the formula comes from (oneDNN 3.x, the v3.12 bundled with torch 2.13)
----------------------------------------------------------------------------
``src/cpu/rnn/rnn_utils.hpp``:
  * ``init_conf``: the leading dimensions (lds) of the workspace regions. The ``get_good_ld`` helper
    it uses is in ``rnn_utils.cpp``.
  * ``set_workspace_sizes``: the byte size of each region.
``src/cpu/rnn/rnn_utils.cpp``:
  * ``get_good_ld(dim, sizeof_dt)``: ``ld = rnd_up(dim, 64 / sizeof_dt)``, plus ``64 / sizeof_dt``
    more when ``ld % 256 == 0``. This keeps rows 64-byte aligned and avoids 4K aliasing.
  * ``set_offsets``: ``register_space`` rounds the running offset up to ``page_size = 4096``
    before each region. The regions, in order, are ws_gates, ws_ht, ws_states_layer,
    ws_states_iter_c, ws_diff_states_layer, ws_diff_states_iter, ws_diff_states_iter_c and
    ws_grid_comp. ``ws_states_iter`` aliases ``ws_states_layer``. The last ``register_space``
    (ws_grid_comp, size 0 for LSTM) rounds the end up to a page again. So
    ``workspace = sum(rnd_up(region_bytes, 4096))``. ws_bias is not in the workspace: it goes to
    the scratchpad, and only for int8.
``src/cpu/rnn/ref_rnn.cpp`` ``pd_t::init``: ``ws_md_ = {ws_sz} u8`` only when ``is_training``
(prop_kind forward_training; ideep's ``lstm_forward_training`` uses it). ``init_brgemm`` and
``init_ref`` both call ``set_workspace_sizes`` after ``init_conf``. ``configure_brgemm``
(``src/cpu/x64/rnn/rnn_brgemm_utils.cpp``) does not touch any workspace ld. So the size is the
same whichever implementation (ref, matmul or brgemm) is picked, and it doesn't depend on thread
count or cache heuristics.

Element types (``ref_rnn.hpp``, ``ref_rnn_common_t``): ``gates_t``, ``ht_t`` and ``src_layer_t``
are the source type. ``gemm_acc_t`` is f32 for both the f32 and bf16 primitives
(``ref_rnn_*_bf16_t = <bf16, bf16, f32>``). The c-state type is the data type of the ``cx``
tensor (``src_iter_c_dt``).

With T=seq_len, B=batch, I=input_size, H=hidden_size, s=dtype_bytes, c=cell_state_bytes and
``ld(d, e) = get_good_ld(d, e)``, the regions in bytes are:
  ws_gates              = T     * B * ld(4H, s)        * s
  ws_ht                 = T     * B * ld(H, s)         * s   (proj_ht_ld; allocated even without projection)
  ws_states_layer       = 2(T+1)* B * ld(max(I,H), s)  * s   (n_layer+1 = 2)
  ws_states_iter_c      = 2(T+1)* B * H                * c   (no padding: "not involved in GEMM")
  ws_diff_states_layer  = 2(T+1)* B * ld(max(I,H), 4)  * 4   (gemm_acc_t = f32)
  ws_diff_states_iter   = 2(T+1)* B * ld(max(I,H), 4)  * 4
  ws_diff_states_iter_c = 2(T+1)* B * H                * 4

Which oneDNN: older releases (oneDNN 3.5, torch 2.6) register ``ws_states_iter`` twice more, unused;
rnn_layout.py has the mechanism and the versions it was checked on:
  workspace(older) = workspace(newer) + 2 * rnd_up(2(T+1) * B * ld(max(I,H), s) * s, 4096)

f16 is not covered: oneDNN's CPU reference RNN refuses f16 training, and PyTorch only sends f16
LSTMs to oneDNN when grad mode is off, which allocates no workspace.

The buffers the two ops allocate internally besides their outputs are in rnn_transients.py.

This module is plain arithmetic; the oneDNN version of the running torch is read by
onednn/version.py when the caller gives none.
"""

from __future__ import annotations

from trainmem.targets.onednn.scratchpad import PAGE_BYTES, round_up
from trainmem.targets.onednn.rnn_layout import RnnLayout, rnn_layout

# rnn_utils.cpp, get_good_ld: rows are padded to 64 bytes, and an ld that is a multiple of 256
# elements gets one more 64-byte chunk.
_LD_ALIGN_BYTES = 64
_LD_ALIAS_ELEMENTS = 256
# rnn_utils.hpp: LSTM has n_gates = 4. PyTorch uses n_layer = n_dir = 1 per primitive, and
# (n_layer + 1) state slots hold the input and output of the layer.
LSTM_GATES = 4
_LAYERS = 1
_DIRECTIONS = 1
# ref_rnn.hpp: gemm_acc_t is f32 for both the f32 and the bf16 primitives.
ACCUMULATOR_BYTES = 4


# older set_offsets: ws_states_iter registered twice more beside ws_states_layer (rnn_layout.py)
_DEAD_STATES_REGISTRATIONS = 2


def get_good_ld(dim: int, sizeof_dt: int) -> int:
    """The ``rnn_utils::get_good_ld`` function from oneDNN (``src/cpu/rnn/rnn_utils.cpp``)."""
    ld = round_up(dim, _LD_ALIGN_BYTES // sizeof_dt)
    return ld + _LD_ALIGN_BYTES // sizeof_dt if ld % _LD_ALIAS_ELEMENTS == 0 else ld


def check_sizes(dtype_bytes: int, *sizes: int) -> None:
    if dtype_bytes not in (2, 4):
        raise ValueError(f"dtype_bytes must be 4 (float32) or 2 (bfloat16), got {dtype_bytes}")
    if min(sizes) <= 0:
        raise ValueError("all sizes must be positive")


def lstm_workspace_regions(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    cell_state_bytes: int | None = None,
    layout: RnnLayout | None = None,
) -> dict[str, int]:
    """Return the unrounded byte size of each workspace region, in ``set_offsets`` order."""
    layout = layout or rnn_layout()
    cell_bytes = dtype_bytes if cell_state_bytes is None else cell_state_bytes
    gate_cells = _LAYERS * _DIRECTIONS  # cells that save gates: n_layer * n_dir * n_iter
    state_slots = (_LAYERS + 1) * _DIRECTIONS * (seq_len + 1)  # (n_layer+1) * n_dir * (n_iter+1)
    # init_conf: slc = input_size, sic = dhc = dlc = dic = hidden_size (no projection).
    states_ld = get_good_ld(max(hidden_size, input_size, hidden_size), dtype_bytes)  # max(sic, max(slc, dlc))
    diff_ld = get_good_ld(max(max(input_size, hidden_size), max(hidden_size, hidden_size)),
                          ACCUMULATOR_BYTES)  # max(slc, dic, sic, dhc)
    states_bytes = state_slots * batch * states_ld * dtype_bytes
    # the unused registrations of older oneDNN: ws_states_iter_size, equal to ws_states_layer_size
    duplicated = {f"ws_states_iter_unused_{index}": states_bytes
                  for index in range(_DEAD_STATES_REGISTRATIONS if layout.dead_states_registrations else 0)}
    return {
        "ws_gates": gate_cells * seq_len * batch * get_good_ld(hidden_size * LSTM_GATES, dtype_bytes) * dtype_bytes,
        "ws_ht": gate_cells * seq_len * batch * get_good_ld(hidden_size, dtype_bytes) * dtype_bytes,
        "ws_states_layer": states_bytes,
        **duplicated,
        "ws_states_iter_c": state_slots * batch * hidden_size * cell_bytes,
        "ws_diff_states_layer": state_slots * batch * diff_ld * ACCUMULATOR_BYTES,
        "ws_diff_states_iter": state_slots * batch * diff_ld * ACCUMULATOR_BYTES,
        "ws_diff_states_iter_c": state_slots * batch * hidden_size * ACCUMULATOR_BYTES,
        "ws_grid_comp": 0,  # lbr-GRU only
    }


def lstm_workspace_bytes(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    bidirectional: bool = False,
    dtype_bytes: int = 4,
    cell_state_bytes: int | None = None,
    layout: RnnLayout | None = None,
) -> int:
    """Return the workspace bytes of one ``aten.mkldnn_rnn_layer`` call (LSTM, grad mode on).

    The arguments describe one call: ``input`` is ``[seq_len, batch, input_size]``.
    ``dtype_bytes`` is 4 for float32 or 2 for bfloat16. ``cell_state_bytes`` is the element size
    of ``cx`` and defaults to ``dtype_bytes``. ``bidirectional`` mirrors the op's argument and
    does not change the size: PyTorch runs each direction as its own unidirectional primitive
    (``reverse=True`` for the backward direction). A bidirectional module makes two calls per
    layer, and later layers see ``input_size = 2 * hidden_size``. ``layout`` is the oneDNN release's
    (rnn_layout.py), by default the running torch's.
    """
    del bidirectional  # no effect on the size: n_dir is always 1 per call
    check_sizes(dtype_bytes, seq_len, batch, input_size, hidden_size)
    regions = lstm_workspace_regions(
        seq_len, batch, input_size, hidden_size, dtype_bytes, cell_state_bytes, layout
    )
    # set_offsets: each register_space rounds the running offset up to a page before adding the
    # region. The final (empty) ws_grid_comp registration rounds the total up once more.
    return sum(round_up(size, PAGE_BYTES) for size in regions.values())


def lstm_module_workspace_bytes(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    dtype_bytes: int = 4,
    layout: RnnLayout | None = None,
) -> list[int]:
    """Return the workspace of each ``mkldnn_rnn_layer`` call an ``nn.LSTM`` forward makes, in order."""
    directions = 2 if bidirectional else 1
    sizes = []
    for layer in range(num_layers):
        layer_input = input_size if layer == 0 else hidden_size * directions
        for _ in range(directions):
            sizes.append(lstm_workspace_bytes(seq_len, batch, layer_input, hidden_size, bidirectional, dtype_bytes,
                                              layout=layout))
    return sizes
