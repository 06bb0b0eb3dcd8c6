# The C types of `_expand.py` when `setup.py` compiles it (Cython's augmenting .pxd); the .py
# itself stays plain Python, so the uncompiled module needs no Cython at run time.
cimport cython

ctypedef (Py_ssize_t, Py_ssize_t, int) Flow    # what every walk step returns: value, channels, rank

cdef object SEQ, REPEAT, NAMED, ADD2, BLOCK, MBCONV, CBR, CBRP, GAP_FC
cdef object IDENTITY, CONV, CONV_DW, GROUP_CONV, BN, FLATTEN, FC
cdef object MAXPOOL, AVGPOOL, GAP, CHANNEL_PADDING, SE
cdef tuple NO_PARAMS
cdef dict KIND_NAME, PRESERVING, STYLE

cdef str _join(str prefix, str name)


cdef class _Walker:
    cdef list records
    cdef Py_ssize_t next_value
    cdef Py_ssize_t next_group

    @cython.locals(value=Py_ssize_t)
    cdef Py_ssize_t emit(self, str kind, tuple params, tuple inputs, Py_ssize_t in_ch, Py_ssize_t out_ch, int rank,
                         str prefix, str path, Py_ssize_t group, str group_kind) except -1

    @cython.locals(group=Py_ssize_t)
    cdef Flow walk(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    cdef Py_ssize_t new_group(self) noexcept

    @cython.locals(index=Py_ssize_t, position=Py_ssize_t, copy=Py_ssize_t, child_path=str, copy_path=str)
    cdef Flow walk_seq(self, tuple children, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    @cython.locals(lhs_value=Py_ssize_t, lhs_ch=Py_ssize_t, lhs_rank=int, rhs_value=Py_ssize_t, rhs_ch=Py_ssize_t,
                   rhs_rank=int, out=Py_ssize_t)
    cdef Flow walk_add2(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    cdef Flow conv(self, Py_ssize_t out_ch, object k, object s, object p, Py_ssize_t groups, Py_ssize_t value,
                   Py_ssize_t ch, int rank, str prefix, str path, Py_ssize_t group, str group_kind)

    cdef Flow bn(self, object momentum, object eps, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                 Py_ssize_t group, str group_kind)

    cdef Flow act(self, str name, tuple params, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                  Py_ssize_t group, str group_kind)

    cdef Flow leaf_gap(self, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path, Py_ssize_t group,
                       str group_kind)

    @cython.locals(in_ch=Py_ssize_t)
    cdef Flow leaf_fc(self, object out, object bias, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                      Py_ssize_t group, str group_kind)

    cdef int need_rank4(self, str what, int rank, str path) except -1

    @cython.locals(out_ch=Py_ssize_t)
    cdef Flow walk_leaf(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                        Py_ssize_t group, str group_kind)

    cdef Flow stochastic_depth(self, object p, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path,
                        Py_ssize_t group, str group_kind)

    @cython.locals(squeeze=Py_ssize_t, group=Py_ssize_t, x=Py_ssize_t)
    cdef Flow walk_se(self, object p, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    @cython.locals(group=Py_ssize_t, pooled=bint)
    cdef Flow walk_cbr(self, object layer, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    @cython.locals(stride=Py_ssize_t, bottleneck=bint, group_kind=str, group=Py_ssize_t, x=Py_ssize_t,
                   in_ch=Py_ssize_t, out=Py_ssize_t, shortcut=Py_ssize_t, index=Py_ssize_t, n_convs=Py_ssize_t,
                   n=str, ds=str)
    cdef Flow walk_block(self, object p, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    @cython.locals(v2=bint, group_kind=str, group=Py_ssize_t, x=Py_ssize_t, in_ch=Py_ssize_t, hidden=Py_ssize_t,
                   index=Py_ssize_t, stages=str, stage=str, project_conv=str, project_bn=str)
    cdef Flow walk_mbconv(self, object p, Py_ssize_t value, Py_ssize_t ch, int rank, str prefix, str path)

    cdef Flow mbconv_stage(self, object p, Py_ssize_t width, object k, object s, Py_ssize_t groups, Py_ssize_t value,
                           Py_ssize_t ch, int rank, str stage, str act_prefix, str path, Py_ssize_t group,
                           str group_kind)
