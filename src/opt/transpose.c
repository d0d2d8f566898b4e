/*
 * transpose.c - a Transpose followed by its inverse is removed: the second
 * Transpose's readers read the first one's input. A chain of two that
 * does not cancel becomes one Transpose with the composed permutation when
 * the first has no other reader.
 */
#include "kernels/kernel.h"
#include "opt/opt.h"

bool kiln_opt_transpose_perm(const struct kiln_node *n, int r, int64_t *p)
{
    const int64_t *v;
    int k = kiln_attr_ints(n, "perm", &v);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (k < 0) {
        if (r < 0) return false;
        for (int i = 0; i < r; i++) p[i] = r - 1 - i;
        return true;
    }
    if (k != r || k > KILN_MAX_RANK) return false;
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < k; i++) {
        if (v[i] < 0 || v[i] >= k || seen[v[i]]) return false;
        seen[v[i]] = true;
        p[i] = v[i];
    }
    return true;
}

kiln_status kiln_opt_transpose(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiln_node *t2 = &g->nodes[i];
        if (kiln_opt_node_dead(t2) || t2->op != KILN_OP_Transpose) continue;
        int p1i = kiln_opt_producer(g, t2->in[0]);
        if (p1i < 0 || g->nodes[p1i].op != KILN_OP_Transpose) continue;
        const struct kiln_node *t1 = &g->nodes[p1i];
        int r = g->values[t1->in[0]].type.rank;
        int64_t a[KILN_MAX_RANK], b[KILN_MAX_RANK], comp[KILN_MAX_RANK];
        if (r < 1 || !kiln_opt_transpose_perm(t1, r, a) ||
            !kiln_opt_transpose_perm(t2, r, b)) continue;
        /* y = T2(T1(x)): y dim i = x dim a[b[i]] */
        bool identity = true;
        for (int d = 0; d < r; d++) {
            comp[d] = a[b[d]];
            identity &= comp[d] == d;
        }
        int x = t1->in[0], y = t2->out[0];
        if (identity) {
            if (kiln_opt_bypass(g, i, x, y)) kiln_opt_count(pl, "Transpose+inverse");
            continue;
        }
        if (kiln_opt_single_consumer(g, t1->out[0]) != i) continue;
        int64_t *pv = kiln_arena_alloc(g->mem, sizeof(int64_t) * (size_t)r);
        if (!pv) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "transpose pass: out of memory");
        for (int d = 0; d < r; d++) pv[d] = comp[d];
        int ni;
        kiln_status st = kiln_opt_add_node(g, KILN_OP_Transpose, g->nodes[i].name, 1, 1, 1,
                                           g->nodes[i].opset, &ni);
        if (st != KILN_OK) return st;
        struct kiln_attr *at = &g->nodes[ni].attr[0];
        at->name = "perm";
        at->type = KILN_ATTR_INTS;
        at->n = r;
        at->ints = pv;
        kiln_opt_set_input(g, ni, 0, x);
        kiln_opt_remove_node(g, i);
        kiln_opt_remove_node(g, p1i);
        kiln_opt_set_output(g, ni, 0, y);
        kiln_opt_count(pl, "Transpose+Transpose");
    }
    return KILN_OK;
}
