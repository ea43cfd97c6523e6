// SHA-256 (FIPS 180-4, computed by OpenSSL libcrypto) for checkpoint manifests: hex digest of a
// byte buffer or file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moerl::io {

std::string sha256_hex(const void* data, size_t size);
// Streams the file; throws BadInput naming the path if it cannot be read.
std::string sha256_file(const std::string& path, uint64_t* size_out = nullptr);

}  // namespace moerl::io
