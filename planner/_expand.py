"""Tree -> primitive layer records. One source in Cython's pure-Python mode: `setup.py` compiles
it (typed by `_expand.pxd`) into the fast path; imported uncompiled it is the oracle.

`expand_tree(root, in_channels)` walks a BluePrint's `Layer` tree in evaluation order and
returns a list of raw records
`(kind, params, inputs, output, in_channels, out_channels, rank, prefix, path, group, group_kind)`,
one per primitive, with value ids in SSA form (0 is the network input). Channel counts are
tracked so blocks can choose their shortcut; a `-1` channel count means "known only after
shape inference" (2-D values after a flatten). Errors raise `ExpandError` with the DSL path.

Compiled, the walker is a cdef class whose counters, channel counts and ranks are C integers
and whose walk steps return C tuples `(value, channels, rank)`. Parameter values (kernels, eps,
...) stay Python objects, so the records are identical, type for type, in both builds.
"""
from blueprint._layer import BlockStyle, Kind
from planner._bounds import check_tree, recursion_room
from planner._expand_error import ExpandError
from planner.ops import OPS, SHAPE_PRESERVING

# Module globals, not `Kind.X` lookups in the walk: compiled, each is one C pointer compare.
SEQ, REPEAT, NAMED, ADD2 = Kind.SEQ, Kind.REPEAT, Kind.NAMED, Kind.ADD2
BLOCK, MBCONV, CBR, CBRP, GAP_FC = Kind.BLOCK, Kind.MBCONV, Kind.CBR, Kind.CBRP, Kind.GAP_FC
IDENTITY, CONV, CONV_DW, GROUP_CONV, BN = Kind.IDENTITY, Kind.CONV, Kind.CONV_DW, Kind.GROUP_CONV, Kind.BN
FLATTEN, FC = Kind.FLATTEN, Kind.FC
MAXPOOL, AVGPOOL, GAP, CHANNEL_PADDING = Kind.MAXPOOL, Kind.AVGPOOL, Kind.GAP, Kind.CHANNEL_PADDING
SE = Kind.SE
NO_PARAMS = ()

# An enum member's `.value`, `__hash__` and BlockStyle's properties are Python-level calls; the
# walker looks them up by member identity in tables made once here instead.
KIND_NAME = {id(k): k.value for k in Kind}
# A DSL leaf named like a shape-preserving row of the op table (the activations, dropout, ...) expands
# to that primitive, generically: its params are the row's `attrs`, read off the DSL's parameter record
# by field name; channels and rank pass through.
PRESERVING = {id(k): (k.value, OPS[k.value].attrs) for k in Kind if k.value in SHAPE_PRESERVING}
STYLE = {id(s): (s.stride, s.bottleneck) for s in BlockStyle}


def _join(prefix, name):
    return name if not prefix else prefix + "." + name


class _Walker:
    def __init__(self):
        self.records = []
        self.next_value = 1
        self.next_group = 0

    def emit(self, kind, params, inputs, in_ch, out_ch, rank, prefix, path, group, group_kind):
        value = self.next_value
        self.next_value += 1
        self.records.append((kind, params, inputs, value, in_ch, out_ch, rank, prefix, path, group, group_kind))
        return value

    # every walk step returns (value, channels, rank)
    def walk(self, layer, value, ch, rank, prefix, path):
        kind = layer.kind
        if kind is SEQ:
            return self.walk_seq(layer.children, value, ch, rank, prefix, path)
        if kind is REPEAT:
            return self.walk_seq((layer,), value, ch, rank, prefix, path)
        if kind is NAMED:
            body = layer.children[0]
            return self.walk(body, value, ch, rank, _join(prefix, layer.params.name), path + "." + KIND_NAME[id(body.kind)])
        if kind is ADD2:
            return self.walk_add2(layer, value, ch, rank, prefix, path)
        if kind is BLOCK:
            return self.walk_block(layer.params, value, ch, rank, prefix, path)
        if kind is MBCONV:
            return self.walk_mbconv(layer.params, value, ch, rank, prefix, path)
        if kind is SE:
            return self.walk_se(layer.params, value, ch, rank, prefix, path)
        if kind is CBR or kind is CBRP:
            return self.walk_cbr(layer, value, ch, rank, prefix, path)
        if kind is GAP_FC:
            group = self.new_group()
            value, ch, rank = self.leaf_gap(value, ch, rank, prefix, path + ".gap", group, "gap_fc")
            return self.leaf_fc(layer.params.out_features, layer.params.bias, value, ch, rank, prefix, path + ".fc",
                                group, "gap_fc")
        return self.walk_leaf(layer, value, ch, rank, prefix, path, -1, "")

    def new_group(self):
        self.next_group += 1
        return self.next_group - 1

    def walk_seq(self, children, value, ch, rank, prefix, path):
        index = 0
        position = 0
        for child in children:
            child_path = f"{path}[{position}].{KIND_NAME[id(child.kind)]}"
            position += 1
            if child.kind is REPEAT:
                body = child.children[0]
                for copy in range(child.params.times):
                    copy_path = f"{child_path}[{copy}].{KIND_NAME[id(body.kind)]}"
                    value, ch, rank = self.walk(body, value, ch, rank, _join(prefix, str(index)), copy_path)
                    index += 1
                continue
            if child.kind is NAMED:
                value, ch, rank = self.walk(child, value, ch, rank, prefix, child_path)
            else:
                value, ch, rank = self.walk(child, value, ch, rank, _join(prefix, str(index)), child_path)
            index += 1
        return value, ch, rank

    def walk_add2(self, layer, value, ch, rank, prefix, path):
        lhs, rhs = layer.children
        lhs_value, lhs_ch, lhs_rank = self.walk(lhs, value, ch, rank, _join(prefix, "0"), path + ".lhs")
        rhs_value, rhs_ch, rhs_rank = self.walk(rhs, value, ch, rank, _join(prefix, "1"), path + ".rhs")
        if lhs_rank != rhs_rank or (lhs_ch != rhs_ch and lhs_ch >= 0 and rhs_ch >= 0):
            raise ExpandError(f"{path}: add2 branches disagree: lhs gives {lhs_ch} channels (rank {lhs_rank}), "
                              f"rhs gives {rhs_ch} channels (rank {rhs_rank}); make both branches end with the same channel count")
        out = self.emit("add", NO_PARAMS, (lhs_value, rhs_value), lhs_ch, lhs_ch, lhs_rank, prefix, path, -1, "")
        return out, lhs_ch, lhs_rank

    def conv(self, out_ch, k, s, p, groups, value, ch, rank, prefix, path, group, group_kind):
        self.need_rank4("conv", rank, path)
        if groups == 0:  # depthwise
            groups, out_ch = ch, ch
        if ch % groups or out_ch % groups:
            raise ExpandError(f"{path}: grouped conv needs in and out channels divisible by groups={groups}, "
                              f"got in={ch}, out={out_ch}")
        params = (("groups", groups), ("kernel", k), ("out_channels", out_ch), ("padding", p), ("stride", s))
        return self.emit("conv", params, (value,), ch, out_ch, 4, prefix, path, group, group_kind), out_ch, 4

    def bn(self, momentum, eps, value, ch, rank, prefix, path, group, group_kind):
        params = (("eps", eps), ("momentum", momentum))
        return self.emit("bn", params, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank

    def act(self, name, params, value, ch, rank, prefix, path, group, group_kind):
        return self.emit(name, params, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank

    def leaf_gap(self, value, ch, rank, prefix, path, group, group_kind):
        self.need_rank4("gap", rank, path)
        return self.emit("gap", NO_PARAMS, (value,), ch, ch, 2, prefix, path, group, group_kind), ch, 2

    def leaf_fc(self, out, bias, value, ch, rank, prefix, path, group, group_kind):
        in_ch = ch if rank == 2 else -1
        params = (("bias", bias), ("out_features", out))
        return self.emit("fc", params, (value,), in_ch, out, 2, prefix, path, group, group_kind), out, 2

    def need_rank4(self, what, rank, path):
        if rank != 4:
            raise ExpandError(f"{path}: {what} needs an NHWC (4-D) input, but it follows a layer that outputs "
                              f"(N, features); move it before the flatten/gap/fc")
        return 0

    def walk_leaf(self, layer, value, ch, rank, prefix, path, group, group_kind):
        kind, p = layer.kind, layer.params
        if kind is IDENTITY:
            return self.emit("identity", NO_PARAMS, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank
        if kind is CONV:
            return self.conv(p.out_channels, p.kernel, p.stride, p.padding, 1, value, ch, rank, prefix, path, group,
                             group_kind)
        if kind is CONV_DW:
            return self.conv(ch, p.kernel, p.stride, p.padding, 0, value, ch, rank, prefix, path, group, group_kind)
        if kind is GROUP_CONV:
            return self.conv(p.out_channels, p.kernel, p.stride, p.padding, p.groups, value, ch, rank, prefix, path,
                             group, group_kind)
        if kind is BN:
            return self.bn(p.momentum, p.eps, value, ch, rank, prefix, path, group, group_kind)
        rule = PRESERVING.get(id(kind))
        if rule is not None:
            name, attrs = rule
            params = tuple([(attr, getattr(p, attr)) for attr in attrs]) if attrs else NO_PARAMS
            return self.act(name, params, value, ch, rank, prefix, path, group, group_kind)
        if kind is FLATTEN:
            out_ch = ch if rank == 2 else -1
            return self.emit("flatten", NO_PARAMS, (value,), ch, out_ch, 2, prefix, path, group, group_kind), out_ch, 2
        if kind is FC:
            return self.leaf_fc(p.out_features, p.bias, value, ch, rank, prefix, path, group, group_kind)
        if kind is MAXPOOL or kind is AVGPOOL:
            name = KIND_NAME[id(kind)]
            self.need_rank4(name, rank, path)
            params = (("kernel", p.kernel), ("padding", p.padding), ("stride", p.stride))
            return self.emit(name, params, (value,), ch, ch, 4, prefix, path, group, group_kind), ch, 4
        if kind is GAP:
            return self.leaf_gap(value, ch, rank, prefix, path, group, group_kind)
        if kind is CHANNEL_PADDING:
            self.need_rank4("channel_padding", rank, path)
            out_ch = -(-ch // p.multiple) * p.multiple
            return self.emit("channel_pad", (("out_channels", out_ch),), (value,), ch, out_ch, 4, prefix, path, group,
                             group_kind), out_ch, 4
        raise ExpandError(f"{path}: no expansion rule for layer kind {kind.value!r}")

    def stochastic_depth(self, p, value, ch, rank, prefix, path, group, group_kind):
        """mbconv's residual branch: a drop_path primitive, or the identity where its probability is 0 (as
        torchvision's StochasticDepth(0), which draws nothing). A `drop_path(p)` leaf is the table's generic
        shape-preserving rule, p = 0 included."""
        kind, params = ("drop_path", (("p", p),)) if p > 0 else ("identity", NO_PARAMS)
        return self.emit(kind, params, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank

    def walk_se(self, p, value, ch, rank, prefix, path):
        """gap -> fc1 -> act -> fc2 -> gate -> x * gate (torchvision's SqueezeExcitation, its names). Group kind
        "se": never fused, and its fc weights are 1x1 convolutions in PyTorch (planner/schedule.py)."""
        self.need_rank4("se", rank, path)
        squeeze = max(1, int(ch * p.squeeze)) if isinstance(p.squeeze, float) else p.squeeze
        group = self.new_group()
        x = value
        value = self.emit("gap", NO_PARAMS, (x,), ch, ch, 2, prefix, path + ".avgpool", group, "se")
        value = self.emit("fc", (("bias", True), ("out_features", squeeze)), (value,), ch, squeeze, 2,
                          _join(prefix, "fc1"), path + ".fc1", group, "se")
        value = self.emit(p.act, NO_PARAMS, (value,), squeeze, squeeze, 2, prefix, path + ".activation", group, "se")
        value = self.emit("fc", (("bias", True), ("out_features", ch)), (value,), squeeze, ch, 2,
                          _join(prefix, "fc2"), path + ".fc2", group, "se")
        value = self.emit(p.gate, NO_PARAMS, (value,), ch, ch, 2, prefix, path + ".scale_activation", group, "se")
        value = self.emit("channel_mul", NO_PARAMS, (x, value), ch, ch, 4, prefix, path + ".scale", group, "se")
        return value, ch, 4

    def walk_cbr(self, layer, value, ch, rank, prefix, path):
        p = layer.params
        group = self.new_group()
        pooled = layer.kind is CBRP
        if not pooled:
            k, s, pad, momentum, eps = p.kernel, p.stride, p.padding, p.momentum, p.eps
        else:
            k, s, pad, momentum, eps = p.conv_kernel, p.conv_stride, p.conv_padding, 0.1, 1e-5
        value, ch, rank = self.conv(p.out_channels, k, s, pad, 1, value, ch, rank, _join(prefix, "0"), path + ".conv",
                                    group, "cbr")
        value, ch, rank = self.bn(momentum, eps, value, ch, rank, _join(prefix, "1"), path + ".bn", group, "cbr")
        value, ch, rank = self.act("relu", NO_PARAMS, value, ch, rank, prefix, path + ".relu", group, "cbr")
        if pooled:
            params = (("kernel", p.pool_kernel), ("padding", p.pool_padding), ("stride", p.pool_stride))
            value = self.emit("maxpool", params, (value,), ch, ch, 4, prefix, path + ".maxpool", -1, "")
        return value, ch, rank

    def walk_block(self, p, value, ch, rank, prefix, path):
        self.need_rank4("block", rank, path)
        stride, bottleneck = STYLE[id(p.style)]
        group_kind = "bottleneck" if bottleneck else "basic_block"
        group = self.new_group()
        x, in_ch = value, ch
        out = p.out_channels
        if bottleneck:
            convs = ((p.mid_channels, 1, 1, 0), (p.mid_channels, 3, stride, 1), (out, 1, 1, 0))
        else:
            convs = ((out, 3, stride, 1), (out, 3, 1, 1))
        n_convs = len(convs)
        for index in range(n_convs):
            width, k, s, pad = convs[index]
            n = str(index + 1)
            value, ch, rank = self.conv(width, k, s, pad, 1, value, ch, rank, _join(prefix, "conv" + n),
                                        path + ".conv" + n, group, group_kind)
            value, ch, rank = self.bn(0.1, 1e-5, value, ch, rank, _join(prefix, "bn" + n), path + ".bn" + n, group,
                                      group_kind)
            if index + 1 < n_convs:
                value, ch, rank = self.act("relu", NO_PARAMS, value, ch, rank, prefix, path + ".relu" + n, group,
                                           group_kind)
        shortcut = x
        if stride != 1 or in_ch != out:
            ds = _join(prefix, "downsample")
            shortcut = self.conv(out, 1, stride, 0, 1, x, in_ch, 4, _join(ds, "0"), path + ".downsample.conv",
                                 group, group_kind)[0]
            shortcut = self.bn(0.1, 1e-5, shortcut, out, 4, _join(ds, "1"), path + ".downsample.bn",
                               group, group_kind)[0]
        value = self.emit("add", NO_PARAMS, (shortcut, value), out, out, 4, prefix, path + ".add", group, group_kind)
        return self.act("relu", NO_PARAMS, value, out, 4, prefix, path + ".relu", group, group_kind)

    def walk_mbconv(self, p, value, ch, rank, prefix, path):
        """Inverted residual: [1x1 expand conv-bn-act], depthwise conv-bn-act, [se], 1x1 project conv-bn,
        [stochastic depth], residual add where stride is 1 and in = out channels. Named as torchvision
        names it. The MobileNetV2 form (relu6, no SE, no stochastic depth) is its `InvertedResidual`:
        stages `conv.<i>` with the projection's conv and bn two flat entries, activations under the
        block's prefix, group kind "inv_residual" (the fused kind). Every other form is its MobileNetV3 /
        EfficientNet block: stages `block.<i>` with conv and bn at `.0`/`.1`, activations under the
        stage, group kind "mbconv" (no fused kind expresses it, so its primitives stay unfused)."""
        self.need_rank4("mbconv", rank, path)
        v2 = p.act == "relu6" and p.se is None and not p.drop_path > 0
        group_kind = "inv_residual" if v2 else "mbconv"
        group = self.new_group()
        x, in_ch = value, ch
        hidden = p.expanded_channels or int(round(in_ch * p.expand_ratio))
        stages = _join(prefix, "conv" if v2 else "block")
        index = 0
        if hidden != in_ch:
            stage = _join(stages, "0")
            value, ch, rank = self.mbconv_stage(p, hidden, 1, 1, 1, value, ch, rank, stage, prefix if v2 else stage,
                                                path + ".expand", group, group_kind)
            index = 1
        stage = _join(stages, str(index))
        value, ch, rank = self.mbconv_stage(p, ch, p.kernel, p.stride, 0, value, ch, rank, stage,
                                            prefix if v2 else stage, path + ".depthwise", group, group_kind)
        index += 1
        if p.se is not None:
            value, ch, rank = self.walk_se(p.se.params, value, ch, rank, _join(stages, str(index)), path + ".se")
            index += 1
        if v2:
            project_conv, project_bn = _join(stages, str(index)), _join(stages, str(index + 1))
        else:
            project_conv, project_bn = _join(stages, str(index) + ".0"), _join(stages, str(index) + ".1")
        value, ch, rank = self.conv(p.out_channels, 1, 1, 0, 1, value, ch, rank, project_conv, path + ".project",
                                    group, group_kind)
        value, ch, rank = self.bn(p.momentum, p.eps, value, ch, rank, project_bn, path + ".project_bn", group,
                                  group_kind)
        if p.stride == 1 and in_ch == p.out_channels:
            if not v2:
                value, ch, rank = self.stochastic_depth(p.drop_path, value, ch, rank, prefix,
                                                        path + ".stochastic_depth", group, group_kind)
            value = self.emit("add", NO_PARAMS, (x, value), ch, ch, 4, prefix, path + ".add", group, group_kind)
        return value, ch, rank

    def mbconv_stage(self, p, width, k, s, groups, value, ch, rank, stage, act_prefix, path, group, group_kind):
        """One conv-bn-act stage of an mbconv: conv and bn named `<stage>.0` and `<stage>.1`, the activation
        `act_prefix`; `path` is the conv's DSL path, the bn's and activation's extend it."""
        value, ch, rank = self.conv(width, k, s, (k - 1) // 2, groups, value, ch, rank, _join(stage, "0"), path, group,
                                    group_kind)
        value, ch, rank = self.bn(p.momentum, p.eps, value, ch, rank, _join(stage, "1"), path + "_bn", group,
                                  group_kind)
        return self.act(p.act, NO_PARAMS, value, ch, rank, act_prefix, path + "_" + p.act, group, group_kind)


def expand_tree(root, in_channels):
    """Flatten `root` (a `Layer`) into raw primitive records; see the module docstring. A tree past
    `planner._bounds`' limits (nesting depth, expanded layers) is refused before the walk."""
    depth = check_tree(root)
    walker = _Walker()
    with recursion_room(depth):
        walker.walk(root, 0, in_channels, 4, "", KIND_NAME[id(root.kind)])
    return walker.records
