"""The benchmark's plots (matplotlib, Agg): latency vs throughput of the
closed-loop sweeps, batching on vs off."""

from __future__ import annotations

from pathlib import Path

from load_tests.runs import Point, Run


def plot(run: Run, img_dir: Path, suffix: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def curve(ax, pts: list[Point], name: str, color: str) -> None:
        pts = sorted(pts, key=lambda p: p.load)
        x = [p.summary["throughput"] for p in pts]
        ax.plot(x, [p.summary["p50_ms"] for p in pts], "o-", color=color, label=f"{name} p50")
        ax.plot(x, [p.summary["p99_ms"] for p in pts], "s--", color=color, alpha=0.7, label=f"{name} p99")
        for p in pts:
            ax.annotate(f"{int(p.load)}", (p.summary["throughput"], p.summary["p50_ms"]), fontsize=7,
                        textcoords="offset points", xytext=(3, -9), color=color)

    def finish(fig, ax, title: str, name: str) -> None:
        eng = run.get("engine", "loop")
        if eng:
            ax.axvline(eng[0].summary["throughput"], color="gray", ls=":", label="engine in-process img/s")
        ax.set_xlabel("achieved throughput (img/s)")
        ax.set_ylabel("latency (ms, log)")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = img_dir / f"{name}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    http, simple, nob = run.get("http", "closed"), run.get("simple", "closed"), run.get("nobatch", "closed")
    if http or simple:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if http:
            curve(ax, http, "service HTTP", "tab:blue")
        if simple:
            curve(ax, simple, "simple server", "tab:red")
        op = run.get("open", "open")
        if op:
            s = op[0].summary
            ax.plot([s["throughput"]] * 2, [s["p50_ms"], s["p99_ms"]], "D", color="tab:green",
                    label=f"service open loop {op[0].load:.2f}/s (p50, p99)")
        finish(fig, ax, "Latency vs throughput, closed loop (labels: clients)", "latency_vs_throughput")
    if http or nob:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if http:
            curve(ax, http, "batching on", "tab:blue")
        if nob:
            curve(ax, nob, "batching off (max_batch_size 1)", "tab:orange")
        finish(fig, ax, "Service: batching on vs off (labels: clients)", "batching_on_off")
    return written


def soak_memory_plot(rows: list, keys: list[str], path: Path) -> None:
    """Each replica's private memory over the soak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for k in keys:
        ax.plot([t for t, _ in rows], [row.get(k) for _, row in rows], label=k.split(":")[0])
    ax.set_xlabel("seconds into the soak")
    ax.set_ylabel("replica private memory (RSS less shared, MB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
