"""What each TensorFlow CPU/GPU kernel does with memory, as far as the step's bytes go: allocate its
outputs, hand an input's buffer on (alias), reuse a dying input's buffer (forward), or work on a variable.

Sources (tensorflow/core, TensorFlow 2.x):
* forwarding: OpKernelContext::forward_input (framework/op_kernel.cc) reuses input i's buffer for an output
  only when the input's buffer has exactly one reference (RefCountIsOne: this op is its last consumer and
  no variable or alias holds it), the dtype and the element count are the output's, and the memory types
  match. Kernels that ask for it call forward_input_or_allocate_output with a list of candidate inputs:
  cwise_ops_common.h UnaryOp ({0}) and BinaryOpShared ({0, 1}; cwise_ops_common.cc), SimpleBinaryOp
  ({0, 1}: TanhGrad, SigmoidGrad, RsqrtGrad, SqrtGrad…), numeric_op.h UnaryElementWiseOp ({0}: Relu, Elu,
  Selu, Softplus…) and BinaryElementWiseOp ({0, 1}: ReluGrad, EluGrad…), bias_op.cc BiasOp ({0}),
  softmax_op.cc SoftmaxOp ({0}), aggregate_ops.cc AddNOp (every input), cwise_op_select.cc ({t, e}),
  constant_op.cc ZerosLikeOp/OnesLikeOp ({0}).
* aliasing (the output *is* the input's buffer, no bytes): identity_op.cc, identity_n_op.cc,
  reshape_op.h, shape_ops.h (ExpandDims, Squeeze), cast_op.cc CastOpBase::Compute when the dtypes match
  (set_output(0, inp)), check_numerics_op.cc, broadcast_to_op.cc when the shape is unchanged.
* variables (resource_variable_ops.cc): ReadVariableOp sets its output to the variable's tensor (no copy)
  unless the variable is in copy-on-read mode (after a sparse access, ResourceGather); AssignVariableOp
  adopts the value's buffer (`*variable->tensor() = value`); AssignAdd/SubVariableOp update in place after
  PrepareToUpdateVariable (training_op_helpers.h), which first copies the variable into a new buffer when
  any read still holds the old one (copy-on-write); ResourceApply* kernels do the same through
  GetInputTensorFromVariable.
* Const: constant_op.cc ConstantOp builds its tensor once, with the kernel; every run outputs that tensor.
"""

from __future__ import annotations

import dataclasses

ALL = -1  # every input is a forwarding candidate (AddN)


@dataclasses.dataclass(frozen=True)
class Rule:
    kind: str  # allocate | forward | alias | read | assign | update | const | input | handle | none
    candidates: tuple[int, ...] = ()  # forward: inputs that may give their buffer to output 0


_UNARY_CWISE = (
    "Abs Neg Sign Square Sqrt Rsqrt Exp Expm1 Log Log1p Tanh Sigmoid Reciprocal Inv Floor Ceil Round Rint "
    "Sin Cos Erf Erfc Softsign Relu Relu6 Elu Selu Softplus LeakyRelu Gelu IsNan LogicalNot Invert Cos Atan "
    "Acos Asin Tan Lgamma Digamma"
).split()
_BINARY_CWISE = (
    "Add AddV2 Sub Mul RealDiv Div DivNoNan MulNoNan FloorDiv FloorMod TruncateDiv Maximum Minimum Pow "
    "SquaredDifference Atan2 Xdivy Xlogy Xlog1py LogicalAnd LogicalOr Equal NotEqual Less LessEqual Greater "
    "GreaterEqual BiasAdd TanhGrad SigmoidGrad RsqrtGrad SqrtGrad ReciprocalGrad ReluGrad Relu6Grad EluGrad "
    "SeluGrad SoftplusGrad SoftsignGrad LeakyReluGrad GeluGrad"
).split()

RULES: dict[str, Rule] = {}
for _name in _UNARY_CWISE:
    RULES[_name] = Rule("forward", (0,))
for _name in _BINARY_CWISE:
    RULES[_name] = Rule("forward", (0, 1))
# BiasAdd forwards only its value (bias_op.cc: forward_input_or_allocate_output({0}, ...))
RULES["BiasAdd"] = Rule("forward", (0,))
for _name in ("Softmax", "LogSoftmax", "ZerosLike", "OnesLike", "Snapshot"):
    RULES[_name] = Rule("forward", (0,))
RULES["AddN"] = Rule("forward", (ALL,))
RULES["Select"] = Rule("forward", (1, 2))
RULES["SelectV2"] = Rule("forward", (1, 2))
for _name in ("Identity", "IdentityN", "Reshape", "ExpandDims", "Squeeze", "StopGradient", "PreventGradient",
              "EnsureShape", "CheckNumerics", "CheckNumericsV2", "Bitcast"):
    RULES[_name] = Rule("alias")
# allocate their outputs (matmul_op.cc, conv_ops*.cc, pooling, reductions, gathers, losses, shapes…)
for _name in (
    "MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 _FusedMatMul Conv2D Conv2DBackpropInput Conv2DBackpropFilter "
    "Conv3D Conv3DBackpropInputV2 Conv3DBackpropFilterV2 DepthwiseConv2dNative "
    "DepthwiseConv2dNativeBackpropInput DepthwiseConv2dNativeBackpropFilter _FusedConv2D MaxPool MaxPoolV2 "
    "MaxPoolGrad MaxPoolGradV2 AvgPool AvgPoolGrad MaxPool3D MaxPool3DGrad AvgPool3D AvgPool3DGrad "
    "BiasAddGrad Sum Mean Max Min Prod All Any ArgMax ArgMin Tile Transpose ConjugateTranspose ConcatV2 Pack "
    "Unpack Split SplitV StridedSlice StridedSliceGrad Slice Pad PadV2 MirrorPad GatherV2 GatherNd "
    "UnsortedSegmentSum ScatterNd SparseSoftmaxCrossEntropyWithLogits SoftmaxCrossEntropyWithLogits Fill "
    "Range Shape ShapeN Size Rank BroadcastTo BroadcastGradientArgs Cast Einsum OneHot Cumsum ClipByValue "
    "FusedBatchNormV3 FusedBatchNormGradV3 ResizeBilinear ResizeNearestNeighbor ReverseV2 TopKV2 InvertPermutation "
    "DynamicStitch Where StatelessRandomUniformV2 StatelessRandomNormalV2 RandomUniform RandomStandardNormal "
    "StatelessRandomGetKeyCounter TensorListFromTensor TensorListReserve EmptyTensorList TensorListStack "
    "VariableShape VarIsInitializedOp NoOp"
).split():
    RULES.setdefault(_name, Rule("allocate"))
RULES["ReadVariableOp"] = Rule("read")
RULES["AssignVariableOp"] = Rule("assign")
for _name in ("AssignAddVariableOp", "AssignSubVariableOp"):
    RULES[_name] = Rule("update")
RULES["Const"] = Rule("const")
RULES["Placeholder"] = Rule("input")
RULES["VarHandleOp"] = Rule("handle")
RULES["NoOp"] = Rule("none")


def rule_for(op_type: str) -> Rule | None:
    """The op's rule, or None for an op no rule covers (traced by its outputs' sizes and reported)."""
    if op_type.startswith(("ResourceApply", "ResourceSparseApply")):
        return Rule("update")
    return RULES.get(op_type)


# ops whose calls a target may size kernel-internal buffers for (cuDNN/oneDNN workspaces): Trace.kernel_calls
KERNEL_OPS = frozenset(
    "MatMul BatchMatMulV2 BatchMatMulV3 _FusedMatMul Conv2D Conv2DBackpropInput Conv2DBackpropFilter Conv3D "
    "Conv3DBackpropInputV2 Conv3DBackpropFilterV2 DepthwiseConv2dNative DepthwiseConv2dNativeBackpropInput "
    "DepthwiseConv2dNativeBackpropFilter _FusedConv2D FusedBatchNormV3 FusedBatchNormGradV3 MaxPool MaxPoolGrad "
    "AvgPool AvgPoolGrad CudnnRNNV3 CudnnRNNBackpropV3".split()
)
# attributes a kernel rule needs (conv geometry, matmul transposes)
KERNEL_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations", "transpose_a",
                "transpose_b", "adj_x", "adj_y", "ksize", "is_training", "epsilon")
