// Bus node, planned hand-over: adopting the listening sockets a previous process of this id gave
// away (node_config::inherit_listeners) and giving ours away (node::detach_listeners()).
#include <arpa/inet.h>
#include <unistd.h>

#include <cstring>

#include "bus/node_impl.h"

namespace uvbus {

namespace {

// Whether two IP literals of one family name the same address, however each is written
// ("::1", "0:0:0:0:0:0:0:1", "FE80::A" and "fe80::a": the bound URL is the system's spelling).
bool same_ip(scheme kind, const std::string& a, const std::string& b) {
  if (a == b) return true;
  const int family = kind == scheme::ipv6 ? AF_INET6 : AF_INET;
  unsigned char x[16] = {};
  unsigned char y[16] = {};
  return inet_pton(family, a.c_str(), x) == 1 && inet_pton(family, b.c_str(), y) == 1 &&
         std::memcmp(x, y, sizeof x) == 0;
}

}  // namespace

bool detail::inherited_fits(const std::string& listen_url, const std::string& inherited_url) {
  if (listen_url == inherited_url) return true;
  address want;
  address have;
  if (parse_address(listen_url, &want) != errc::ok ||
      parse_address(inherited_url, &have) != errc::ok) {
    return false;
  }
  const auto tcp = [](scheme k) { return k == scheme::ipv4 || k == scheme::ipv6; };
  if (!tcp(have.kind) || (want.kind != scheme::dns && want.kind != have.kind)) return false;
  if (want.kind != scheme::dns && !same_ip(want.kind, want.host, have.host)) return false;
  return want.port == 0 || want.port == have.port;
}

namespace {

// Whether listen_url takes inherited_url in the first pass: the same URL, or a fixed port.
bool exact_fit(const std::string& listen_url, const std::string& inherited_url) {
  if (listen_url == inherited_url) return true;
  address want;
  return parse_address(listen_url, &want) == errc::ok && want.port != 0 &&
         detail::inherited_fits(listen_url, inherited_url);
}

}  // namespace

std::vector<int> detail::match_inherited(const std::vector<std::string>& listen,
                                         const std::vector<inherited_listener>& inherited) {
  std::vector<int> out(listen.size(), -1);
  std::vector<bool> used(inherited.size(), false);
  for (const bool exact : {true, false}) {
    for (size_t i = 0; i < listen.size(); ++i) {
      for (size_t j = 0; j < inherited.size() && out[i] < 0; ++j) {
        const std::string& have = inherited[j].url;
        if (used[j] || !(exact ? exact_fit(listen[i], have) : inherited_fits(listen[i], have))) {
          continue;
        }
        used[j] = true;
        out[i] = static_cast<int>(j);
      }
    }
  }
  return out;
}

errc node::impl::open_stream_listener(stream_channel* ch, const std::string& u, size_t index,
                                      listener_id* l) {
  const std::string field = "node_config.listen[" + std::to_string(index) + "] \"" + u + "\": ";
  const int k = index < cfg.listen.size() && cfg.listen[index] == u
                    ? detail::match_inherited(cfg.listen, cfg.inherit_listeners)[index]
                    : -1;
  if (k >= 0 && cfg.inherit_listeners[static_cast<size_t>(k)].fd >= 0) {
    const auto j = static_cast<size_t>(k);
    inherited_listener& in = cfg.inherit_listeners[j];
    const int fd = in.fd;
    in.fd = -1;  // listen_fd() owns it now, whatever the result
    const errc e = ch->listen_fd(u, fd, l);
    if (e == errc::ok) return e;
    const std::string why = ch->last_error().detail;
    // listen_fd() names "inherited socket N" when the socket is at fault (it does not fit, listen()
    // on it failed); anything else (a TLS file read at listen time) is the listen URL's, as when
    // binding afresh. The code is listen_fd()'s either way.
    if (why.find(": inherited socket ") == std::string::npos) {
      return refuse_call(e, field + "listening failed: " + why);
    }
    return refuse_call(e, "node::start: node_config.inherit_listeners[" + std::to_string(j) +
                              "] (fd " + std::to_string(fd) + "): " + why);
  }
  const errc e = ch->listen(u, l);
  // The channel's detail names the cause (a TLS file only tls_context::create() reads, ...).
  if (e != errc::ok) return refuse_call(e, field + "listening failed: " + ch->last_error().detail);
  return e;
}

void node::impl::close_inherited() noexcept {
  for (inherited_listener& in : cfg.inherit_listeners) {
    const int fd = in.fd;
    if (fd < 0) continue;
    ::close(fd);
    // Once: a config listing one fd twice (refused by validate()) must not close it again.
    for (inherited_listener& other : cfg.inherit_listeners) {
      if (other.fd == fd) other.fd = -1;
    }
  }
}

errc node::impl::detach_listeners(std::vector<inherited_listener>* out) {
  if (out == nullptr) return fail(errc::invalid_argument, "node::detach_listeners: out is null");
  if (state != run_state::running) {
    return fail(errc::wrong_state, "node::detach_listeners: the node is not running");
  }
  // In listen order (the successor matches them to its listen URLs whatever the order).
  size_t done = 0;
  for (; done < stream_listeners.size(); ++done) {
    const auto& [url, id] = stream_listeners[done];
    const std::string bound = streams->listener_url(id);
    int fd = -1;
    const errc e = streams->detach_listener(id, &fd);
    if (e != errc::ok) {
      std::string why = "node::detach_listeners: \"" + url + "\": ";  // before url moves
      why += streams->last_error().detail;
      stream_listeners.erase(stream_listeners.begin(),
                             stream_listeners.begin() + static_cast<std::ptrdiff_t>(done));
      return fail(e, std::move(why));
    }
    out->push_back(inherited_listener{bound, fd});
  }
  stream_listeners.clear();
  return errc::ok;
}

}  // namespace uvbus
