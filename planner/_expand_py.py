"""Tree -> primitive layer records: the pure-Python twin of `_expand_c.pyx` (same algorithm).

`expand_tree(root, in_channels)` walks a BluePrint's `Layer` tree in evaluation order and
returns a list of raw records
`(kind, params, inputs, output, in_channels, out_channels, rank, prefix, path, group, group_kind)`,
one per primitive, with value ids in SSA form (0 is the network input). Channel counts are
tracked so blocks can choose their shortcut; a `-1` channel count means "known only after
shape inference" (2-D values after a flatten). Errors raise `ExpandError` with the DSL path.
"""
from blueprint._layer import Kind

ACTIVATION_NAME = {
    Kind.RELU: "relu", Kind.RELU6: "relu6", Kind.LEAKY_RELU: "leaky_relu", Kind.SIGMOID: "sigmoid",
    Kind.TANH: "tanh", Kind.SILU: "silu", Kind.HARDSWISH: "hardswish", Kind.GELU: "gelu",
}


class ExpandError(ValueError):
    """A structural error found while flattening the tree; the message names the DSL path."""


def _join(prefix, name):
    return name if not prefix else prefix + "." + name


class _Walker:
    def __init__(self, in_channels):
        self.records = []
        self.next_value = 1
        self.next_group = 0

    def emit(self, kind, params, inputs, in_ch, out_ch, rank, prefix, path, group, group_kind):
        value = self.next_value
        self.next_value += 1
        self.records.append((kind, params, tuple(inputs), value, in_ch, out_ch, rank, prefix, path, group, group_kind))
        return value

    # every walk_* returns (value, channels, rank)
    def walk(self, layer, value, ch, rank, prefix, path):
        kind = layer.kind
        if kind is Kind.SEQ:
            return self.walk_seq(layer.children, value, ch, rank, prefix, path)
        if kind is Kind.REPEAT:
            return self.walk_seq((layer,), value, ch, rank, prefix, path)
        if kind is Kind.NAMED:
            body = layer.children[0]
            return self.walk(body, value, ch, rank, _join(prefix, layer.params.name), path + "." + body.kind.value)
        if kind is Kind.ADD2:
            return self.walk_add2(layer, value, ch, rank, prefix, path)
        if kind is Kind.BLOCK:
            return self.walk_block(layer.params, value, ch, rank, prefix, path)
        if kind is Kind.MBCONV:
            return self.walk_mbconv(layer.params, value, ch, rank, prefix, path)
        if kind in (Kind.CBR, Kind.CBRP):
            return self.walk_cbr(layer, value, ch, rank, prefix, path)
        if kind is Kind.GAP_FC:
            group = self.new_group()
            value, ch, rank = self.leaf_gap(value, ch, rank, prefix, path + ".gap", group, "gap_fc")
            return self.leaf_fc(layer.params.out_features, layer.params.bias, value, ch, rank, prefix, path + ".fc", group, "gap_fc")
        return self.walk_leaf(layer, value, ch, rank, prefix, path, -1, "")

    def new_group(self):
        self.next_group += 1
        return self.next_group - 1

    def walk_seq(self, children, value, ch, rank, prefix, path):
        index = 0
        for position, child in enumerate(children):
            child_path = path + "[" + str(position) + "]." + child.kind.value
            if child.kind is Kind.REPEAT:
                body = child.children[0]
                for copy in range(child.params.times):
                    copy_path = child_path + "[" + str(copy) + "]." + body.kind.value
                    value, ch, rank = self.walk(body, value, ch, rank, _join(prefix, str(index)), copy_path)
                    index += 1
                continue
            if child.kind is Kind.NAMED:
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
        out = self.emit("add", (), (lhs_value, rhs_value), lhs_ch, lhs_ch, lhs_rank, prefix, path, -1, "")
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
        return self.emit("gap", (), (value,), ch, ch, 2, prefix, path, group, group_kind), ch, 2

    def leaf_fc(self, out, bias, value, ch, rank, prefix, path, group, group_kind):
        in_ch = ch if rank == 2 else -1
        params = (("bias", bias), ("out_features", out))
        return self.emit("fc", params, (value,), in_ch, out, 2, prefix, path, group, group_kind), out, 2

    def need_rank4(self, what, rank, path):
        if rank != 4:
            raise ExpandError(f"{path}: {what} needs an NHWC (4-D) input, but it follows a layer that outputs "
                              f"(N, features); move it before the flatten/gap/fc")

    def walk_leaf(self, layer, value, ch, rank, prefix, path, group, group_kind):
        kind, p = layer.kind, layer.params
        if kind is Kind.IDENTITY:
            return self.emit("identity", (), (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank
        if kind is Kind.CONV:
            return self.conv(p.out_channels, p.kernel, p.stride, p.padding, 1, value, ch, rank, prefix, path, group, group_kind)
        if kind is Kind.CONV_DW:
            return self.conv(ch, p.kernel, p.stride, p.padding, 0, value, ch, rank, prefix, path, group, group_kind)
        if kind is Kind.GROUP_CONV:
            return self.conv(p.out_channels, p.kernel, p.stride, p.padding, p.groups, value, ch, rank, prefix, path, group, group_kind)
        if kind is Kind.BN:
            return self.bn(p.momentum, p.eps, value, ch, rank, prefix, path, group, group_kind)
        if kind in ACTIVATION_NAME:
            params = (("slope", p.slope),) if kind is Kind.LEAKY_RELU else ()
            return self.act(ACTIVATION_NAME[kind], params, value, ch, rank, prefix, path, group, group_kind)
        if kind is Kind.DROPOUT:
            return self.emit("dropout", (("p", p.p),), (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank
        if kind is Kind.FLATTEN:
            out_ch = ch if rank == 2 else -1
            return self.emit("flatten", (), (value,), ch, out_ch, 2, prefix, path, group, group_kind), out_ch, 2
        if kind is Kind.FC:
            return self.leaf_fc(p.out_features, p.bias, value, ch, rank, prefix, path, group, group_kind)
        if kind in (Kind.MAXPOOL, Kind.AVGPOOL):
            self.need_rank4(kind.value, rank, path)
            params = (("kernel", p.kernel), ("padding", p.padding), ("stride", p.stride))
            return self.emit(kind.value, params, (value,), ch, ch, 4, prefix, path, group, group_kind), ch, 4
        if kind is Kind.GAP:
            return self.leaf_gap(value, ch, rank, prefix, path, group, group_kind)
        if kind is Kind.CHANNEL_PADDING:
            self.need_rank4("channel_padding", rank, path)
            out_ch = -(-ch // p.multiple) * p.multiple
            return self.emit("channel_pad", (("out_channels", out_ch),), (value,), ch, out_ch, 4, prefix, path, group, group_kind), out_ch, 4
        raise ExpandError(f"{path}: no expansion rule for layer kind {kind.value!r}")

    def walk_cbr(self, layer, value, ch, rank, prefix, path):
        p = layer.params
        group = self.new_group()
        if layer.kind is Kind.CBR:
            k, s, pad, momentum, eps = p.kernel, p.stride, p.padding, p.momentum, p.eps
        else:
            k, s, pad, momentum, eps = p.conv_kernel, p.conv_stride, p.conv_padding, 0.1, 1e-5
        value, ch, rank = self.conv(p.out_channels, k, s, pad, 1, value, ch, rank, _join(prefix, "0"), path + ".conv", group, "cbr")
        value, ch, rank = self.bn(momentum, eps, value, ch, rank, _join(prefix, "1"), path + ".bn", group, "cbr")
        value, ch, rank = self.act("relu", (), value, ch, rank, prefix, path + ".relu", group, "cbr")
        if layer.kind is Kind.CBRP:
            params = (("kernel", p.pool_kernel), ("padding", p.pool_padding), ("stride", p.pool_stride))
            value = self.emit("maxpool", params, (value,), ch, ch, 4, prefix, path + ".maxpool", -1, "")
        return value, ch, rank

    def walk_block(self, p, value, ch, rank, prefix, path):
        self.need_rank4("block", rank, path)
        stride = p.style.stride
        bottleneck = p.style.bottleneck
        group_kind = "bottleneck" if bottleneck else "basic_block"
        group = self.new_group()
        x, in_ch = value, ch
        out = p.out_channels
        if bottleneck:
            convs = ((p.mid_channels, 1, 1, 0), (p.mid_channels, 3, stride, 1), (out, 1, 1, 0))
        else:
            convs = ((out, 3, stride, 1), (out, 3, 1, 1))
        for index, (width, k, s, pad) in enumerate(convs):
            n = str(index + 1)
            value, ch, rank = self.conv(width, k, s, pad, 1, value, ch, rank, _join(prefix, "conv" + n), path + ".conv" + n, group, group_kind)
            value, ch, rank = self.bn(0.1, 1e-5, value, ch, rank, _join(prefix, "bn" + n), path + ".bn" + n, group, group_kind)
            if index + 1 < len(convs):
                value, ch, rank = self.act("relu", (), value, ch, rank, prefix, path + ".relu" + n, group, group_kind)
        shortcut = x
        if stride != 1 or in_ch != out:
            ds = _join(prefix, "downsample")
            shortcut, _, _ = self.conv(out, 1, stride, 0, 1, x, in_ch, 4, _join(ds, "0"), path + ".downsample.conv", group, group_kind)
            shortcut, _, _ = self.bn(0.1, 1e-5, shortcut, out, 4, _join(ds, "1"), path + ".downsample.bn", group, group_kind)
        value = self.emit("add", (), (shortcut, value), out, out, 4, prefix, path + ".add", group, group_kind)
        value, ch, rank = self.act("relu", (), value, out, 4, prefix, path + ".relu", group, group_kind)
        return value, ch, rank

    def walk_mbconv(self, p, value, ch, rank, prefix, path):
        self.need_rank4("mbconv", rank, path)
        group = self.new_group()
        x, in_ch = value, ch
        hidden = int(round(in_ch * p.expand_ratio))
        conv_prefix = _join(prefix, "conv")
        index = 0
        if p.expand_ratio != 1:
            value, ch, rank = self.conv(hidden, 1, 1, 0, 1, value, ch, rank, _join(conv_prefix, "0.0"), path + ".expand", group, "inv_residual")
            value, ch, rank = self.bn(0.1, 1e-5, value, ch, rank, _join(conv_prefix, "0.1"), path + ".expand_bn", group, "inv_residual")
            value, ch, rank = self.act("relu6", (), value, ch, rank, prefix, path + ".expand_relu6", group, "inv_residual")
            index = 1
        dw = _join(conv_prefix, str(index))
        pad = (p.kernel - 1) // 2
        value, ch, rank = self.conv(ch, p.kernel, p.stride, pad, 0, value, ch, rank, _join(dw, "0"), path + ".depthwise", group, "inv_residual")
        value, ch, rank = self.bn(0.1, 1e-5, value, ch, rank, _join(dw, "1"), path + ".depthwise_bn", group, "inv_residual")
        value, ch, rank = self.act("relu6", (), value, ch, rank, prefix, path + ".depthwise_relu6", group, "inv_residual")
        value, ch, rank = self.conv(p.out_channels, 1, 1, 0, 1, value, ch, rank, _join(conv_prefix, str(index + 1)), path + ".project", group, "inv_residual")
        value, ch, rank = self.bn(0.1, 1e-5, value, ch, rank, _join(conv_prefix, str(index + 2)), path + ".project_bn", group, "inv_residual")
        if p.stride == 1 and in_ch == p.out_channels:
            value = self.emit("add", (), (x, value), ch, ch, 4, prefix, path + ".add", group, "inv_residual")
        return value, ch, rank


def expand_tree(root, in_channels):
    """Flatten `root` (a `Layer`) into raw primitive records; see the module docstring."""
    walker = _Walker(in_channels)
    walker.walk(root, 0, in_channels, 4, "", root.kind.value)
    return walker.records
