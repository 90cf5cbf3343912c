#pragma once
/// \file protocols/lgc.hpp
/// The LGC protocol forms (seed 004, Section IV) over any Transport: the ring
/// form `lgc_ring_node<Policy>` (Algorithm 2) and the parameter-server form
/// `lgc_ps_worker<Policy>` / `lgc_ps_server<Policy>` (Algorithm 1). A
/// third-layer header: it names the LGC codec (autoencoder.hpp) and the ring
/// all-reduce driver. Link zlib (CMake: gradcomp::lgc).

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/protocols/lgc_ps.hpp>
#include <gradcomp/protocols/lgc_ring.hpp>
