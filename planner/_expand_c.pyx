# cython: language_level=3
"""Tree -> primitive layer records, compiled: the Cython port of `planner._expand_py`.

The same algorithm, walk order and error messages as the pure-Python twin (the living
definition; read its module docstring for the record layout). Only the bookkeeping is
typed: the walker is a cdef class, value/group counters, channel counts and ranks are C
integers, and every walk step returns a C struct instead of a Python tuple. Parameter
values (kernels, eps, ...) stay Python objects so the records are identical, type for type.
The tests compare both expanders on every zoo model and on random trees.
"""
from blueprint._layer import BlockStyle, Kind
from planner._expand_py import ACTIVATION_NAME, ExpandError

cdef object SEQ = Kind.SEQ
cdef object REPEAT = Kind.REPEAT
cdef object NAMED = Kind.NAMED
cdef object ADD2 = Kind.ADD2
cdef object BLOCK = Kind.BLOCK
cdef object MBCONV = Kind.MBCONV
cdef object CBR = Kind.CBR
cdef object CBRP = Kind.CBRP
cdef object GAP_FC = Kind.GAP_FC
cdef object IDENTITY = Kind.IDENTITY
cdef object CONV = Kind.CONV
cdef object CONV_DW = Kind.CONV_DW
cdef object GROUP_CONV = Kind.GROUP_CONV
cdef object BN = Kind.BN
cdef object LEAKY_RELU = Kind.LEAKY_RELU
cdef object DROPOUT = Kind.DROPOUT
cdef object FLATTEN = Kind.FLATTEN
cdef object FC = Kind.FC
cdef object MAXPOOL = Kind.MAXPOOL
cdef object AVGPOOL = Kind.AVGPOOL
cdef object GAP = Kind.GAP
cdef object CHANNEL_PADDING = Kind.CHANNEL_PADDING
cdef tuple NO_PARAMS = ()

# Enum `.value`, `__hash__` and BlockStyle's properties are Python-level calls; the walker
# looks them up by member identity in tables made once here instead.
cdef dict KIND_NAME = {id(k): k.value for k in Kind}
cdef dict ACTIVATIONS = {id(k): name for k, name in ACTIVATION_NAME.items()}
cdef dict STYLE = {id(s): (s.stride, s.bottleneck) for s in BlockStyle}


ctypedef struct Flow:       # what every walk step returns: the value it defines, its channels and rank
    Py_ssize_t value
    Py_ssize_t ch
    int rank


cdef inline Flow flow(Py_ssize_t value, Py_ssize_t ch, int rank) noexcept:
    cdef Flow f
    f.value, f.ch, f.rank = value, ch, rank
    return f


cdef inline str _join(str prefix, str name):
    return name if not prefix else prefix + "." + name


cdef class _Walker:
    cdef list records
    cdef Py_ssize_t next_value
    cdef Py_ssize_t next_group

    def __cinit__(self):
        self.records = []
        self.next_value = 1
        self.next_group = 0

    cdef Py_ssize_t emit(self, str kind, tuple params, tuple inputs, Py_ssize_t in_ch, Py_ssize_t out_ch, int rank,
                         str prefix, str path, Py_ssize_t group, str group_kind) except -1:
        cdef Py_ssize_t value = self.next_value
        self.next_value += 1
        self.records.append((kind, params, inputs, value, in_ch, out_ch, rank, prefix, path, group, group_kind))
        return value

    cdef Flow walk(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path) except *:
        cdef object kind = layer.kind
        cdef object body
        cdef Py_ssize_t group
        cdef Flow f
        if kind is SEQ:
            return self.walk_seq(layer.children, value, ch, rank, prefix, path)
        if kind is REPEAT:
            return self.walk_seq((layer,), value, ch, rank, prefix, path)
        if kind is NAMED:
            body = layer.children[0]
            return self.walk(body, value, ch, rank, _join(prefix, layer.params.name), path + "." + <str>KIND_NAME[id(body.kind)])
        if kind is ADD2:
            return self.walk_add2(layer, value, ch, rank, prefix, path)
        if kind is BLOCK:
            return self.walk_block(layer.params, value, ch, rank, prefix, path)
        if kind is MBCONV:
            return self.walk_mbconv(layer.params, value, ch, rank, prefix, path)
        if kind is CBR or kind is CBRP:
            return self.walk_cbr(layer, value, ch, rank, prefix, path)
        if kind is GAP_FC:
            group = self.new_group()
            f = self.leaf_gap(value, ch, rank, prefix, path + ".gap", group, "gap_fc")
            return self.leaf_fc(layer.params.out_features, layer.params.bias, f.value, f.ch, f.rank, prefix,
                                path + ".fc", group, "gap_fc")
        return self.walk_leaf(layer, value, ch, rank, prefix, path, -1, "")

    cdef inline Py_ssize_t new_group(self) noexcept:
        self.next_group += 1
        return self.next_group - 1

    cdef Flow walk_seq(self, tuple children, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path) except *:
        cdef Py_ssize_t index = 0, position = 0, copy, times
        cdef object child, body
        cdef str child_path, copy_path
        cdef Flow f = flow(value, ch, rank)
        for child in children:
            child_path = f"{path}[{position}].{<str>KIND_NAME[id(child.kind)]}"
            position += 1
            if child.kind is REPEAT:
                body = child.children[0]
                times = child.params.times
                for copy in range(times):
                    copy_path = f"{child_path}[{copy}].{<str>KIND_NAME[id(body.kind)]}"
                    f = self.walk(body, f.value, f.ch, f.rank, _join(prefix, str(index)), copy_path)
                    index += 1
                continue
            if child.kind is NAMED:
                f = self.walk(child, f.value, f.ch, f.rank, prefix, child_path)
            else:
                f = self.walk(child, f.value, f.ch, f.rank, _join(prefix, str(index)), child_path)
            index += 1
        return f

    cdef Flow walk_add2(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path) except *:
        lhs, rhs = layer.children
        cdef Flow l = self.walk(lhs, value, ch, rank, _join(prefix, "0"), path + ".lhs")
        cdef Flow r = self.walk(rhs, value, ch, rank, _join(prefix, "1"), path + ".rhs")
        if l.rank != r.rank or (l.ch != r.ch and l.ch >= 0 and r.ch >= 0):
            raise ExpandError(f"{path}: add2 branches disagree: lhs gives {l.ch} channels (rank {l.rank}), "
                              f"rhs gives {r.ch} channels (rank {r.rank}); make both branches end with the same channel count")
        cdef Py_ssize_t out = self.emit("add", NO_PARAMS, (l.value, r.value), l.ch, l.ch, l.rank, prefix, path, -1, "")
        return flow(out, l.ch, l.rank)

    cdef Flow conv(self, Py_ssize_t out_ch, object k, object s, object p, Py_ssize_t groups, Py_ssize_t value,
                   Py_ssize_t ch, int rank, str prefix, str path, Py_ssize_t group, str group_kind) except *:
        self.need_rank4("conv", rank, path)
        if groups == 0:  # depthwise
            groups, out_ch = ch, ch
        if ch % groups or out_ch % groups:
            raise ExpandError(f"{path}: grouped conv needs in and out channels divisible by groups={groups}, "
                              f"got in={ch}, out={out_ch}")
        params = (("groups", groups), ("kernel", k), ("out_channels", out_ch), ("padding", p), ("stride", s))
        return flow(self.emit("conv", params, (value,), ch, out_ch, 4, prefix, path, group, group_kind), out_ch, 4)

    cdef Flow bn(self, object momentum, object eps, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                 Py_ssize_t group, str group_kind) except *:
        params = (("eps", eps), ("momentum", momentum))
        return flow(self.emit("bn", params, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank)

    cdef Flow act(self, str name, tuple params, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                  Py_ssize_t group, str group_kind) except *:
        return flow(self.emit(name, params, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank)

    cdef Flow leaf_gap(self, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path, Py_ssize_t group,
                       str group_kind) except *:
        self.need_rank4("gap", rank, path)
        return flow(self.emit("gap", NO_PARAMS, (value,), ch, ch, 2, prefix, path, group, group_kind), ch, 2)

    cdef Flow leaf_fc(self, object out, object bias, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                      Py_ssize_t group, str group_kind) except *:
        cdef Py_ssize_t in_ch = ch if rank == 2 else -1
        params = (("bias", bias), ("out_features", out))
        return flow(self.emit("fc", params, (value,), in_ch, out, 2, prefix, path, group, group_kind), out, 2)

    cdef int need_rank4(self, str what, int rank, str path) except -1:
        if rank != 4:
            raise ExpandError(f"{path}: {what} needs an NHWC (4-D) input, but it follows a layer that outputs "
                              f"(N, features); move it before the flatten/gap/fc")
        return 0

    cdef Flow walk_leaf(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                        Py_ssize_t group, str group_kind) except *:
        cdef object kind = layer.kind
        cdef object p = layer.params
        cdef Py_ssize_t out_ch
        cdef object name
        if kind is IDENTITY:
            return flow(self.emit("identity", NO_PARAMS, (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank)
        if kind is CONV:
            return self.conv(p.out_channels, p.kernel, p.stride, p.padding, 1, value, ch, rank, prefix, path, group, group_kind)
        if kind is CONV_DW:
            return self.conv(ch, p.kernel, p.stride, p.padding, 0, value, ch, rank, prefix, path, group, group_kind)
        if kind is GROUP_CONV:
            return self.conv(p.out_channels, p.kernel, p.stride, p.padding, p.groups, value, ch, rank, prefix, path,
                             group, group_kind)
        if kind is BN:
            return self.bn(p.momentum, p.eps, value, ch, rank, prefix, path, group, group_kind)
        name = ACTIVATIONS.get(id(kind))
        if name is not None:
            params = (("slope", p.slope),) if kind is LEAKY_RELU else NO_PARAMS
            return self.act(name, params, value, ch, rank, prefix, path, group, group_kind)
        if kind is DROPOUT:
            return flow(self.emit("dropout", (("p", p.p),), (value,), ch, ch, rank, prefix, path, group, group_kind), ch, rank)
        if kind is FLATTEN:
            out_ch = ch if rank == 2 else -1
            return flow(self.emit("flatten", NO_PARAMS, (value,), ch, out_ch, 2, prefix, path, group, group_kind), out_ch, 2)
        if kind is FC:
            return self.leaf_fc(p.out_features, p.bias, value, ch, rank, prefix, path, group, group_kind)
        if kind is MAXPOOL or kind is AVGPOOL:
            name = KIND_NAME[id(kind)]
            self.need_rank4(name, rank, path)
            params = (("kernel", p.kernel), ("padding", p.padding), ("stride", p.stride))
            return flow(self.emit(name, params, (value,), ch, ch, 4, prefix, path, group, group_kind), ch, 4)
        if kind is GAP:
            return self.leaf_gap(value, ch, rank, prefix, path, group, group_kind)
        if kind is CHANNEL_PADDING:
            self.need_rank4("channel_padding", rank, path)
            out_ch = -(-ch // p.multiple) * p.multiple
            return flow(self.emit("channel_pad", (("out_channels", out_ch),), (value,), ch, out_ch, 4, prefix, path,
                                  group, group_kind), out_ch, 4)
        raise ExpandError(f"{path}: no expansion rule for layer kind {kind.value!r}")

    cdef Flow walk_cbr(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path) except *:
        cdef object p = layer.params
        cdef Py_ssize_t group = self.new_group()
        cdef bint pooled = layer.kind is CBRP
        if not pooled:
            k, s, pad, momentum, eps = p.kernel, p.stride, p.padding, p.momentum, p.eps
        else:
            k, s, pad, momentum, eps = p.conv_kernel, p.conv_stride, p.conv_padding, 0.1, 1e-5
        cdef Flow f = self.conv(p.out_channels, k, s, pad, 1, value, ch, rank, _join(prefix, "0"), path + ".conv", group, "cbr")
        f = self.bn(momentum, eps, f.value, f.ch, f.rank, _join(prefix, "1"), path + ".bn", group, "cbr")
        f = self.act("relu", NO_PARAMS, f.value, f.ch, f.rank, prefix, path + ".relu", group, "cbr")
        if pooled:
            params = (("kernel", p.pool_kernel), ("padding", p.pool_padding), ("stride", p.pool_stride))
            f.value = self.emit("maxpool", params, (f.value,), f.ch, f.ch, 4, prefix, path + ".maxpool", -1, "")
        return f

    cdef Flow walk_block(self, object p, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path) except *:
        self.need_rank4("block", rank, path)
        cdef Py_ssize_t stride
        cdef bint bottleneck
        stride, bottleneck = STYLE[id(p.style)]
        cdef str group_kind = "bottleneck" if bottleneck else "basic_block"
        cdef Py_ssize_t group = self.new_group()
        cdef Py_ssize_t x = value, in_ch = ch, out = p.out_channels, shortcut, index, n_convs
        cdef Flow f = flow(value, ch, rank)
        cdef str n, ds
        if bottleneck:
            convs = ((p.mid_channels, 1, 1, 0), (p.mid_channels, 3, stride, 1), (out, 1, 1, 0))
        else:
            convs = ((out, 3, stride, 1), (out, 3, 1, 1))
        n_convs = len(convs)
        for index in range(n_convs):
            width, k, s, pad = convs[index]
            n = str(index + 1)
            f = self.conv(width, k, s, pad, 1, f.value, f.ch, f.rank, _join(prefix, "conv" + n), path + ".conv" + n,
                          group, group_kind)
            f = self.bn(0.1, 1e-5, f.value, f.ch, f.rank, _join(prefix, "bn" + n), path + ".bn" + n, group, group_kind)
            if index + 1 < n_convs:
                f = self.act("relu", NO_PARAMS, f.value, f.ch, f.rank, prefix, path + ".relu" + n, group, group_kind)
        shortcut = x
        if stride != 1 or in_ch != out:
            ds = _join(prefix, "downsample")
            shortcut = self.conv(out, 1, stride, 0, 1, x, in_ch, 4, _join(ds, "0"), path + ".downsample.conv",
                                 group, group_kind).value
            shortcut = self.bn(0.1, 1e-5, shortcut, out, 4, _join(ds, "1"), path + ".downsample.bn",
                               group, group_kind).value
        value = self.emit("add", NO_PARAMS, (shortcut, f.value), out, out, 4, prefix, path + ".add", group, group_kind)
        return self.act("relu", NO_PARAMS, value, out, 4, prefix, path + ".relu", group, group_kind)

    cdef Flow walk_mbconv(self, object p, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path) except *:
        self.need_rank4("mbconv", rank, path)
        cdef Py_ssize_t group = self.new_group()
        cdef Py_ssize_t x = value, in_ch = ch, index = 0
        cdef Py_ssize_t hidden = int(round(in_ch * p.expand_ratio))
        cdef str conv_prefix = _join(prefix, "conv")
        cdef str dw
        cdef Flow f = flow(value, ch, rank)
        if p.expand_ratio != 1:
            f = self.conv(hidden, 1, 1, 0, 1, f.value, f.ch, f.rank, _join(conv_prefix, "0.0"), path + ".expand",
                          group, "inv_residual")
            f = self.bn(0.1, 1e-5, f.value, f.ch, f.rank, _join(conv_prefix, "0.1"), path + ".expand_bn", group, "inv_residual")
            f = self.act("relu6", NO_PARAMS, f.value, f.ch, f.rank, prefix, path + ".expand_relu6", group, "inv_residual")
            index = 1
        dw = _join(conv_prefix, str(index))
        pad = (p.kernel - 1) // 2
        f = self.conv(f.ch, p.kernel, p.stride, pad, 0, f.value, f.ch, f.rank, _join(dw, "0"), path + ".depthwise",
                      group, "inv_residual")
        f = self.bn(0.1, 1e-5, f.value, f.ch, f.rank, _join(dw, "1"), path + ".depthwise_bn", group, "inv_residual")
        f = self.act("relu6", NO_PARAMS, f.value, f.ch, f.rank, prefix, path + ".depthwise_relu6", group, "inv_residual")
        f = self.conv(p.out_channels, 1, 1, 0, 1, f.value, f.ch, f.rank, _join(conv_prefix, str(index + 1)),
                      path + ".project", group, "inv_residual")
        f = self.bn(0.1, 1e-5, f.value, f.ch, f.rank, _join(conv_prefix, str(index + 2)), path + ".project_bn",
                    group, "inv_residual")
        if p.stride == 1 and in_ch == p.out_channels:
            f.value = self.emit("add", NO_PARAMS, (x, f.value), f.ch, f.ch, 4, prefix, path + ".add", group, "inv_residual")
        return f


def expand_tree(root, in_channels):
    """Flatten `root` (a `Layer`) into raw primitive records; see `planner._expand_py`."""
    cdef _Walker walker = _Walker()
    walker.walk(root, 0, in_channels, 4, "", KIND_NAME[id(root.kind)])
    return walker.records
