"""Turns probe.py's JSON lines into check_engine's input: to_lines.py ISA MEASURED.jsonl"""
import json
import sys


def main():
    isa, path = sys.argv[1], sys.argv[2]
    for line in open(path):
        p = json.loads(line)
        if "err" in p:
            continue
        S, K, st, pad, dil = p["S"], p["K"], p["stride"], p["pad"], p["dil"]
        two_d = p["dim"] == 2
        H, kh = (S, K) if two_d else (1, 1)
        W, kw = S, K
        oh = (H + 2 * pad - dil * (kh - 1) - 1) // st + 1 if two_d else 1
        ow = (W + 2 * pad - dil * (kw - 1) - 1) // st + 1
        sh, ph, dh = (st, pad, dil) if two_d else (1, 0, 1)
        head = [isa, p["N"], p["Ci"], p["Co"], p["groups"], H, W, kh, kw, oh, ow,
                sh, st, ph, pad, dh, dil, int(p["bias"]), int(p["xg"]), int(p.get("cl", False))]
        print(" ".join(map(str, head)), ";", " ".join(map(str, p["fwd"])), ";",
              " ".join(map(str, p["bwd"])))


if __name__ == "__main__":
    main()
