// SHA-256 through OpenSSL's EVP interface (libcrypto): the SHA extensions / AVX2 code paths
// a maintained library keeps, instead of a hand-written round function.
#include "io/sha256.h"

#include <openssl/evp.h>  // EVP_MD_CTX, EVP_DigestInit_ex / Update / Final_ex, EVP_sha256

#include <cstdio>  // FILE, std::fread
#include <memory>  // std::unique_ptr owning the EVP context
#include <vector>

#include "common/check.h"

namespace moerl::io {
namespace {

// One digest in progress; every EVP call is checked (they fail only on allocation errors).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    MOERL_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1,
                "OpenSSL cannot start a sha256 digest");
  }
  void update(const void* data, size_t size) {
    MOERL_CHECK(EVP_DigestUpdate(ctx_.get(), data, size) == 1, "OpenSSL sha256 update failed");
  }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    MOERL_CHECK(EVP_DigestFinal_ex(ctx_.get(), digest, &n) == 1 && n == 32,
                "OpenSSL sha256 final failed");
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < n; i++) {
      out.push_back(digits[digest[i] >> 4]);
      out.push_back(digits[digest[i] & 0xf]);
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

}  // namespace

std::string sha256_hex(const void* data, size_t size) {
  Sha256 s;
  s.update(data, size);
  return s.hex();
}

std::string sha256_file(const std::string& path, uint64_t* size_out) {
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  MOERL_CHECK_INPUT(f != nullptr, "cannot open ", path);
  Sha256 s;
  std::vector<unsigned char> buf(1 << 20);
  uint64_t total = 0;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    s.update(buf.data(), n);
    total += n;
  }
  MOERL_CHECK_INPUT(!std::ferror(f.get()), "read error in ", path);
  if (size_out) *size_out = total;
  return s.hex();
}

}  // namespace moerl::io
