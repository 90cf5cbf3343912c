#!/usr/bin/env python3
"""SimGrid platform files for bench/smpi (issue 21, item 6). Python 3, no extra deps.

Flat switch clusters (SimGrid <cluster>): one private link per node with the
rate and latency of its class, a backbone of bb_bw = N x the link rate and
bb_lat = 1 us, SimGrid's default sharing policy (no sharing_policy attribute).
Two-level fat trees (<cluster topology="FAT_TREE">) for 64 and 256 nodes: 16
nodes per leaf switch and 16 top switches, one link from each leaf to each
top switch, so a leaf's uplinks add up to its nodes' bandwidth (no
oversubscription); every link of the tree has the class's rate and latency
(SimGrid gives one bw/lat to all links of a fat-tree cluster).

Host speed: the speed calibrated on this machine (bench_smpi_allreduce
--calibrate), the same value as smpirun's --cfg=smpi/host-speed; one core per node.

  make_platforms.py --speed 2.1e9 --nodes 16 --gbit 10 [--topology flat|fattree] -o p.xml
  make_platforms.py --speed 2.1e9 --all DIR        # every platform of the issue into DIR
"""
import argparse
import os
import sys

# link class: Gbit/s -> latency in microseconds (issue 21)
LINK_CLASSES = {1: 50, 10: 20, 25: 10, 100: 5}
FLAT_NODES = (4, 16, 64, 256)
FAT_TREE_NODES = (64, 256)
NODES_PER_LEAF = 16

HEADER = """<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
"""


def platform_name(topology, nodes, gbit):
    return f"{topology}_{nodes}_{gbit}gbit"


def platform_xml(topology, nodes, gbit, speed):
    if gbit not in LINK_CLASSES:
        raise ValueError(f"link rate {gbit} Gbit/s is not one of {sorted(LINK_CLASSES)}")
    lat = LINK_CLASSES[gbit]
    name = platform_name(topology, nodes, gbit)
    if topology == "flat":
        body = (f"  <!-- {name}: {nodes} nodes, one private {gbit} Gbit/s, {lat} us link each, "
                f"backbone {nodes * gbit} Gbit/s, 1 us; host speed {speed:.6g} flop/s (calibrated) -->\n"
                f'  <cluster id="{name}" prefix="node-" radical="0-{nodes - 1}" suffix="" speed="{speed:.6g}f" '
                f'bw="{gbit}Gbps" lat="{lat}us" bb_bw="{nodes * gbit}Gbps" bb_lat="1us"/>\n')
    elif topology == "fattree":
        if nodes % NODES_PER_LEAF:
            raise ValueError(f"a fat tree needs a multiple of {NODES_PER_LEAF} nodes")
        leaves = nodes // NODES_PER_LEAF
        # h; m_1,m_2 (children per switch); w_1,w_2 (parents per node); p_1,p_2 (parallel links)
        params = f"2;{NODES_PER_LEAF},{leaves};1,{NODES_PER_LEAF};1,1"
        body = (f"  <!-- {name}: {nodes} nodes, {leaves} leaf switches of {NODES_PER_LEAF} nodes, "
                f"{NODES_PER_LEAF} top switches, every link {gbit} Gbit/s, {lat} us (no oversubscription); "
                f"host speed {speed:.6g} flop/s (calibrated) -->\n"
                f'  <cluster id="{name}" prefix="node-" radical="0-{nodes - 1}" suffix="" speed="{speed:.6g}f" '
                f'bw="{gbit}Gbps" lat="{lat}us" topology="FAT_TREE" topo_parameters="{params}"/>\n')
    else:
        raise ValueError(f"unknown topology {topology!r} (flat or fattree)")
    return HEADER + body + "</platform>\n"


def all_platforms():
    for nodes in FLAT_NODES:
        for gbit in LINK_CLASSES:
            yield "flat", nodes, gbit
    for nodes in FAT_TREE_NODES:
        for gbit in LINK_CLASSES:
            yield "fattree", nodes, gbit


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speed", type=float, required=True, help="host speed in flop/s (the calibrated one)")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--gbit", type=int, choices=sorted(LINK_CLASSES))
    ap.add_argument("--topology", default="flat", choices=("flat", "fattree"))
    ap.add_argument("-o", "--out", help="output file (default: stdout)")
    ap.add_argument("--all", metavar="DIR", help="write every platform of issue 21 into DIR as <topology>_<N>_<R>gbit.xml")
    a = ap.parse_args(argv)
    if a.speed <= 0:
        ap.error("--speed must be positive")
    print(f"make_platforms.py: host speed {a.speed:.6g} flop/s (set smpi/host-speed to the same value)", file=sys.stderr)
    if a.all:
        os.makedirs(a.all, exist_ok=True)
        for topology, nodes, gbit in all_platforms():
            path = os.path.join(a.all, platform_name(topology, nodes, gbit) + ".xml")
            with open(path, "w") as f:
                f.write(platform_xml(topology, nodes, gbit, a.speed))
            print(path)
        return 0
    if a.nodes is None or a.gbit is None:
        ap.error("--nodes and --gbit (or --all DIR)")
    text = platform_xml(a.topology, a.nodes, a.gbit, a.speed)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
