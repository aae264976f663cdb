"""CPU emulation (as emulate_chain.py): a shorter chain, (I − L)(I + L²)(I + L⁴) (exact up to L⁷, residual L⁸) and
Newton steps instead of the full chain and its refinement step. Exact in exact arithmetic after one step (the
residual squares to L¹⁶ = 0), but its tf32 correction then carries the large L⁸ term: one step is 10× worse on alike
keys, two steps (8 products, as many as the landed form) are as good. ``PYTHONPATH=src:. python emulate_newton.py``."""
import sys
sys.argv = ["x"]
src = open("benchmarks/tuning/2026-12-02/intra_precision/emulate_chain.py").read().split('print("--- per chain')[0]
for spread in ("None", "0.3", "0.1"):
    exec(src.replace("for spread in (None, 0.3, 0.1):", f"for spread in ({spread},):").replace("print(", "(lambda *a, **k: None)("))
    t = lambda a, b: mm(a, b, tf32)
    Lf = L.float(); If = I.float()
    L2 = t(Lf, Lf); L4 = t(L2, L2)
    D0 = t(t(If - Lf, If + L2), If + L4)          # exact up to L^7: the residual is L^8, and L^16 = 0
    D1 = D0 + t(D0, If - t(If + Lf, D0))           # one Newton step: exact in exact arithmetic
    D2 = D1 + t(D1, If - t(If + Lf, D1))           # a second step: rounding only
    L8 = t(L4, L4); Dc = t(t(t(If - Lf, If + L2), If + L4), If + L8); Dr = Dc + t(Dc, If - t(If + Lf, Dc))
    def err(D):
        Ct = D * bb[..., None, :].float()
        Cs = -t(t(D[:, :, 1:], E.float()), Ct[:, :, :-1])
        return f"diag {rel(Ct, Ct64):.1e} sub {rel(Cs, Cs64):.1e}"
    print(f"spread {spread}: chain+refine (8 products) {err(Dr)} | truncated+1 Newton (6) {err(D1)} | +2 Newton (8) {err(D2)}")
