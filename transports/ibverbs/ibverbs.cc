// ibverbs: ranks whose hosts have RDMA devices (InfiniBand or RoCE), over reliable-connected queue pairs.
// Built only with libibverbs (CMake CHORUS_IBVERBS); without a device the transport reaches no peer and says why.
//
// Per communicator (transport instance) one device context: the port and GID chosen from CHORUS_IB_HCA and
// CHORUS_IB_GID_INDEX (select.h), a protection domain, one completion queue with a completion channel (the
// executor sleeps on its fd), and a registration cache (mr_cache.h). Per connection (peer, channel):
// CHORUS_IB_QPS_PER_CONNECTION RC queue pairs and one registered region holding a send ring and a receive ring of
// `depth` slots each. The protocol (slots.h): message seq is one RDMA write with immediate from send slot seq % depth
// into the peer's receive slot seq % depth on queue pair seq % nqps; every release returns a credit, a zero-byte
// write with immediate; the sender waits for both its local completion and the credit before reusing a slot.
// Connection data (QPNs, PSNs, LID/GID, MTU, ring address and rkey) goes through the bootstrap (conn_data.h):
// prepare() creates the queue pairs and the rings, connect() brings the queue pairs INIT -> RTR -> RTS; the
// communicator lets no data flow until both sides are connected.
//
// GPU buffers: GPUDirect RDMA (registering device memory through dma-buf, ibv_reg_dmabuf_mr) is not supported;
// the executor copies every slice into the host slot rings, which is how device buffers are staged through pinned
// (registered) host memory.
//
// This file cannot run where there is no RDMA device (the machines this project builds on have none: no kernel
// InfiniBand support, so no soft-RoCE); scripts/rdma-check.sh runs the matrix and the perf sweep where one exists.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "transports/ibverbs/conn_data.h"
#include "transports/ibverbs/mr_cache.h"
#include "transports/ibverbs/select.h"
#include "transports/ibverbs/slots.h"
#include "transports/transports.h"

namespace chorus {

namespace {

using namespace ib;

// Header then payload at a 16-byte boundary, as in the other ring transports.
constexpr size_t kHeaderSpace = 48;
static_assert(sizeof(WireHeader) <= kHeaderSpace);
constexpr int kPollBatch = 32;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

[[noreturn]] void sys_fail(const std::string& what, int err) {
  throw Error(chorusSystemError, Subsys::Transport, cat("ibverbs: ", what, ": ", std::strerror(err)));
}

void fork_init_once() {
  static std::once_flag once;
  // Copy-on-fork is safe without ibv_fork_init on kernels >= 5.13 (IBV_FORK_UNNEEDED); older ones need it before
  // anything is registered, or a child's touch of a registered page breaks the parent's registration.
  std::call_once(once, [] {
    if (ibv_is_fork_initialized() == IBV_FORK_DISABLED) ibv_fork_init();
  });
}

// A port this rank can use, and what peers need to reach it.
struct Port {
  std::string device;
  int port = 0;
  LinkLayer link_layer = LinkLayer::InfiniBand;
  uint16_t lid = 0;
  uint8_t mtu = 0;  // active, enum ibv_mtu
  int gid_index = -1;
  std::array<uint8_t, 16> gid{};
  std::string text() const {
    return cat(device, " port ", port, ": ", link_layer_name(link_layer), ", MTU ", mtu_bytes(mtu),
               link_layer == LinkLayer::InfiniBand ? cat(", LID ", lid) : std::string(), ", GID[", gid_index, "] ",
               gid_text(gid));
  }
};

struct Scan {
  std::vector<Port> ports;  // usable, in device then port order
  std::string why;          // when ports is empty
  std::string skipped;      // ports seen but not usable, and why
};

std::vector<GidEntry> gid_table(ibv_context* ctx, int port, int len) {
  std::vector<GidEntry> t;
  for (int i = 0; i < len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, port, i, &e, 0) != 0) continue;  // empty entries are ENODATA
    GidEntry g;
    g.index = i;
    std::memcpy(g.gid.data(), e.gid.raw, 16);
    g.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::RoCEv2
             : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::RoCEv1
                                                  : GidType::IB;
    t.push_back(g);
  }
  return t;
}

Scan scan_ports(const HcaFilter& filter, int gid_wanted) {
  fork_init_once();
  Scan s;
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    s.why = cat("no RDMA device (ibv_get_device_list failed: ", std::strerror(errno ? errno : ENODEV),
                "; is the kernel's RDMA support loaded?)");
    return s;
  }
  if (n == 0) {
    ibv_free_device_list(list);
    s.why = "no RDMA device (ibv_get_device_list returned 0 devices)";
    return s;
  }
  for (int d = 0; d < n; ++d) {
    const std::string name = ibv_get_device_name(list[d]);
    ibv_context* ctx = ibv_open_device(list[d]);
    if (ctx == nullptr) {
      s.skipped += cat(s.skipped.empty() ? "" : "; ", name, ": cannot open (", std::strerror(errno), ")");
      continue;
    }
    ibv_device_attr dattr{};
    if (ibv_query_device(ctx, &dattr) == 0) {
      for (int p = 1; p <= dattr.phys_port_cnt; ++p) {
        if (!filter.matches(name, p)) continue;
        ibv_port_attr pattr{};
        if (ibv_query_port(ctx, p, &pattr) != 0) continue;
        if (pattr.state != IBV_PORT_ACTIVE) {
          s.skipped += cat(s.skipped.empty() ? "" : "; ", name, " port ", p, ": ", ibv_port_state_str(pattr.state));
          continue;
        }
        Port port;
        port.device = name;
        port.port = p;
        port.link_layer = pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::Ethernet : LinkLayer::InfiniBand;
        port.lid = pattr.lid;
        port.mtu = static_cast<uint8_t>(pattr.active_mtu);
        std::string why;
        port.gid_index =
            choose_gid(gid_table(ctx, p, pattr.gid_tbl_len), port.link_layer == LinkLayer::Ethernet, gid_wanted, &why);
        if (port.gid_index < 0) {
          s.skipped += cat(s.skipped.empty() ? "" : "; ", name, " port ", p, ": ", why);
          continue;
        }
        ibv_gid gid{};
        if (ibv_query_gid(ctx, p, port.gid_index, &gid) == 0) std::memcpy(port.gid.data(), gid.raw, 16);
        if (port.link_layer == LinkLayer::InfiniBand && port.lid == 0) {
          s.skipped += cat(s.skipped.empty() ? "" : "; ", name, " port ", p, ": no LID (is a subnet manager running?)");
          continue;
        }
        s.ports.push_back(port);
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (s.ports.empty())
    s.why = cat(n, " RDMA device(s) but no usable port",
                param_is_set(Param::IbHca) ? cat(" matching CHORUS_IB_HCA=", param_str(Param::IbHca)) : "",
                s.skipped.empty() ? "" : cat(" (", s.skipped, ")"));
  return s;
}

class IbConnection;

// The device context one transport instance uses; shared with its connections so it outlives whichever goes first.
class Device {
 public:
  Device(const Port& port, int nqps) : port_(port), nqps_(nqps) {
    ibv_device** list = ibv_get_device_list(nullptr);
    if (list == nullptr) sys_fail("ibv_get_device_list", errno);
    for (ibv_device** d = list; *d != nullptr; ++d)
      if (port.device == ibv_get_device_name(*d)) ctx_ = ibv_open_device(*d);
    ibv_free_device_list(list);
    if (ctx_ == nullptr) sys_fail(cat("cannot open ", port.device), errno ? errno : ENODEV);
    try {
      if ((pd_ = ibv_alloc_pd(ctx_)) == nullptr) sys_fail("ibv_alloc_pd", errno);
      if ((channel_ = ibv_create_comp_channel(ctx_)) == nullptr) sys_fail("ibv_create_comp_channel", errno);
      const int flags = fcntl(channel_->fd, F_GETFL);
      fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK);
      ibv_device_attr attr{};
      if (ibv_query_device(ctx_, &attr) != 0) sys_fail("ibv_query_device", errno);
      max_cqe_ = attr.max_cqe;
      max_qp_wr_ = attr.max_qp_wr;
      if ((cq_ = ibv_create_cq(ctx_, std::min(max_cqe_, 4096), nullptr, channel_, 0)) == nullptr)
        sys_fail("ibv_create_cq", errno);
      mr_cache_ = std::make_unique<MrCache>(
          [this](uintptr_t addr, size_t len) {
            ibv_mr* mr =
                ibv_reg_mr(pd_, reinterpret_cast<void*>(addr), len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
            if (mr == nullptr)
              sys_fail(cat("ibv_reg_mr of ", len, " bytes (is the locked-memory limit high enough?)"), errno);
            Registration r;
            r.lkey = mr->lkey;
            r.rkey = mr->rkey;
            r.handle = mr;
            return r;
          },
          [](const Registration& r) { ibv_dereg_mr(static_cast<ibv_mr*>(r.handle)); });
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~Device() { destroy(); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const Port& port() const { return port_; }
  int nqps() const { return nqps_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }
  int fd() const { return channel_->fd; }
  int max_qp_wr() const { return max_qp_wr_; }
  MrCache& mr_cache() { return *mr_cache_; }

  uint32_t add(IbConnection* c) {
    conns_.push_back(c);
    return static_cast<uint32_t>(conns_.size() - 1);
  }
  void remove(uint32_t id) { conns_[id] = nullptr; }

  // Polls the completion queue and hands every completion to its connection. Returns true if any arrived.
  bool poll();

  // Events to sleep on fd(), or 0 when completions are pending (poll first).
  short arm() {
    void* ctx = nullptr;
    ibv_cq* cq = nullptr;
    while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ++unacked_;
    if (unacked_ > 0) {
      ibv_ack_cq_events(cq_, unacked_);
      unacked_ = 0;
    }
    if (ibv_req_notify_cq(cq_, 0) != 0) return 0;
    // A completion that came before the request does not signal: look once more.
    return poll() ? 0 : POLLIN;
  }

  void wait(int timeout_us) {
    if (arm() == 0) return;
    pollfd p{fd(), POLLIN, 0};
    ::poll(&p, 1, std::max(1, timeout_us / 1000));
  }

 private:
  void destroy() {
    mr_cache_.reset();  // deregisters: before the protection domain goes
    if (cq_ != nullptr) {
      if (unacked_ > 0) ibv_ack_cq_events(cq_, unacked_);
      ibv_destroy_cq(cq_);
    }
    if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (ctx_ != nullptr) ibv_close_device(ctx_);
    cq_ = nullptr, channel_ = nullptr, pd_ = nullptr, ctx_ = nullptr;
  }

  Port port_;
  int nqps_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  int max_cqe_ = 0, max_qp_wr_ = 0;
  unsigned unacked_ = 0;
  std::unique_ptr<MrCache> mr_cache_;
  std::vector<IbConnection*> conns_;  // by connection id; nullptr once gone
};

// Queue pairs and rings of one (peer, channel), from prepare() until the connection takes them over.
struct Endpoint {
  std::shared_ptr<Device> dev;
  std::vector<ibv_qp*> qps;
  void* mem = nullptr;
  MrCache::Ref mr;
  ConnData local;
  uint64_t depth = 0;
  size_t stride = 0;
  uint32_t sq_depth = 0, rq_depth = 0;

  Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint() {
    // Queue pairs first: once they are gone the device writes nothing more into the ring.
    for (ibv_qp* q : qps) ibv_destroy_qp(q);
    mr.reset();
    if (mem != nullptr) dev->mr_cache().invalidate(mem, 2 * depth * stride);
    std::free(mem);
  }
};

std::unique_ptr<Endpoint> make_endpoint(std::shared_ptr<Device> dev, size_t slot_bytes, int depth) {
  auto e = std::make_unique<Endpoint>();
  e->dev = std::move(dev);
  e->depth = static_cast<uint64_t>(depth);
  e->stride = round_up(kHeaderSpace + slot_bytes, 64);
  const size_t bytes = round_up(2 * e->depth * e->stride, 4096);
  if ((e->mem = std::aligned_alloc(4096, bytes)) == nullptr) sys_fail(cat("cannot allocate ", bytes, " bytes"), ENOMEM);
  std::memset(e->mem, 0, bytes);
  e->mr = e->dev->mr_cache().acquire(e->mem, bytes);
  // Send queue: `depth` data writes and as many credits; receive queue: the same inbound (slots.h).
  e->sq_depth = static_cast<uint32_t>(std::min(2 * depth + 2, e->dev->max_qp_wr()));
  e->rq_depth = e->sq_depth;
  std::mt19937 rng(std::random_device{}());
  const Port& port = e->dev->port();
  for (int i = 0; i < e->dev->nqps(); ++i) {
    ibv_qp_init_attr init{};
    init.send_cq = e->dev->cq();
    init.recv_cq = e->dev->cq();
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = e->sq_depth;
    init.cap.max_recv_wr = e->rq_depth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 0;
    ibv_qp* qp = ibv_create_qp(e->dev->pd(), &init);
    if (qp == nullptr) sys_fail("ibv_create_qp", errno);
    e->qps.push_back(qp);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<uint8_t>(port.port);
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      sys_fail("moving a queue pair to INIT", err);
    e->local.qps.push_back({qp->qp_num, static_cast<uint32_t>(rng() & 0xffffff)});
  }
  e->local.link_layer = port.link_layer;
  e->local.port = static_cast<uint8_t>(port.port);
  e->local.lid = port.lid;
  e->local.mtu = port.mtu;
  e->local.gid_index = port.gid_index;
  e->local.gid = port.gid;
  e->local.ring_addr = reinterpret_cast<uintptr_t>(e->mem) + e->depth * e->stride;  // the receive half
  e->local.ring_rkey = e->mr->rkey;
  e->local.slots = static_cast<uint32_t>(depth);
  e->local.slot_stride = e->stride;
  return e;
}

// RESET/INIT -> RTR -> RTS for queue pair i towards the peer's queue pair i.
void bring_up(Endpoint& e, const ConnData& remote) {
  const Port& port = e.dev->port();
  for (size_t i = 0; i < e.qps.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(std::min(e.local.mtu, remote.mtu));
    a.dest_qp_num = remote.qps[i].qpn;
    a.rq_psn = remote.qps[i].psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;  // 0.64 ms
    a.ah_attr.port_num = static_cast<uint8_t>(port.port);
    a.ah_attr.sl = 0;
    a.ah_attr.src_path_bits = 0;
    // RoCE always routes by GID; InfiniBand by LID, with a GRH only towards another subnet.
    const bool other_subnet = std::memcmp(remote.gid.data(), e.local.gid.data(), 8) != 0;
    if (port.link_layer == LinkLayer::Ethernet || other_subnet) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(port.gid_index);
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = 0;
      a.ah_attr.grh.flow_label = 0;
    }
    a.ah_attr.dlid = remote.lid;
    if (int err = ibv_modify_qp(e.qps[i], &a,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      sys_fail(cat("moving queue pair ", i, " to RTR (peer GID ", gid_text(remote.gid), ", LID ", remote.lid, ")"),
               err);
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
    r.retry_cnt = 7;
    r.rnr_retry = 7;  // receiver not ready: retry forever (receives are reposted as completions are polled)
    r.sq_psn = e.local.qps[i].psn;
    r.max_rd_atomic = 1;
    if (int err = ibv_modify_qp(e.qps[i], &r,
                                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC))
      sys_fail(cat("moving queue pair ", i, " to RTS"), err);
  }
}

class IbConnection : public Connection {
 public:
  IbConnection(std::unique_ptr<Endpoint> e, const ConnData& remote, int peer, int channel, size_t slot_bytes)
      : Connection(peer, channel, slot_bytes),
        e_(std::move(e)),
        dev_(e_->dev),
        remote_(remote),
        swin_(static_cast<uint32_t>(e_->depth)),
        rwin_(static_cast<uint32_t>(e_->depth)),
        recv_len_(e_->depth, 0),
        sq_used_(e_->qps.size(), 0) {
    id_ = dev_->add(this);
    try {
      // Receives are posted before RTR: a write with immediate that finds none is retried (RNR), never lost.
      for (size_t q = 0; q < e_->qps.size(); ++q)
        for (uint32_t k = 0; k < e_->rq_depth; ++k)
          if (!post_recv(q)) fail(error_);
      bring_up(*e_, remote_);
    } catch (...) {
      dev_->remove(id_);
      throw;
    }
  }

  ~IbConnection() override { dev_->remove(id_); }

  std::byte* send_slot() override {
    if (!can_post()) {
      dev_->poll();
      if (!can_post()) {
        if (!error_.empty()) fail(error_);
        return nullptr;
      }
    }
    return send_at(swin_.posted()) + kHeaderSpace;
  }

  void send_commit(const WireHeader& h) override {
    if (!error_.empty()) fail(error_);
    const uint64_t seq = swin_.post();
    std::byte* s = send_at(seq);
    std::memcpy(s, &h, sizeof(h));
    const size_t q = seq % e_->qps.size();
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(s);
    sge.length = static_cast<uint32_t>(kHeaderSpace + h.bytes);
    sge.lkey = e_->mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = encode_wr_id({WrKind::Data, static_cast<uint8_t>(q), id_, static_cast<uint32_t>(seq)});
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.imm_data = htonl(encode_imm({ImmKind::Data, static_cast<uint32_t>(seq & kImmValueMask)}));
    wr.wr.rdma.remote_addr = remote_.ring_addr + (seq % remote_.slots) * remote_.slot_stride;
    wr.wr.rdma.rkey = remote_.ring_rkey;
    post_send(q, wr, "RDMA write");
  }

  MessageView recv_peek() override {
    if (!rwin_.ready()) {
      dev_->poll();
      if (!rwin_.ready()) {
        if (!error_.empty()) fail(error_);
        return {};
      }
    }
    const uint32_t slot = rwin_.next_slot();
    std::byte* s = recv_at(slot);
    WireHeader h;
    std::memcpy(&h, s, sizeof(h));
    if (h.magic != WireHeader::kMagic) fail("received a message with a bad magic");
    if (h.bytes > slot_bytes() || kHeaderSpace + h.bytes != recv_len_[slot])
      fail(cat("received ", recv_len_[slot], " bytes for a header announcing ", h.bytes, " payload bytes"));
    return {reinterpret_cast<const WireHeader*>(s), s + kHeaderSpace};
  }

  void recv_release() override {
    credit_ = rwin_.release();
    credit_due_ = true;
    send_credit();
  }

  bool progress() override {
    bool moved = dev_->poll();
    if (credit_due_) moved |= send_credit();
    return moved;
  }

  bool send_idle() const override { return swin_.idle() && !credit_due_; }
  int poll_fd() const override { return dev_->fd(); }
  short arm_poll() override { return credit_due_ ? 0 : dev_->arm(); }
  void wait_recv(int timeout_us) override { dev_->wait(timeout_us); }
  void wait_send(int timeout_us) override { dev_->wait(timeout_us); }

  // A work completion of this connection (from Device::poll).
  void on_completion(const ibv_wc& wc, const WrId& id) {
    if (wc.status != IBV_WC_SUCCESS) {
      // The first error is the cause; the flushes that follow it say nothing new.
      if (error_.empty())
        error_ = cat(ibv_wc_status_str(wc.status), " (vendor error ", wc.vendor_err,
                     wc.status == IBV_WC_RETRY_EXC_ERR ? "; the peer died or is unreachable" : "", ")");
      return;
    }
    std::string why;
    switch (id.kind) {
      case WrKind::Data:
        if (id.qp < sq_used_.size()) --sq_used_[id.qp];
        if (!swin_.on_write_done(id.seq) && error_.empty())
          error_ = cat("completion for a write that is not outstanding (", id.seq, ")");
        break;
      case WrKind::Credit:
        --sq_used_[0];
        --credits_in_flight_;
        break;
      case WrKind::Recv: {
        if (id.qp < e_->qps.size()) post_recv(id.qp);
        if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
          if (error_.empty()) error_ = cat("unexpected completion opcode ", wc.opcode);
          break;
        }
        const Imm imm = decode_imm(ntohl(wc.imm_data));
        if (imm.kind == ImmKind::Credit) {
          if (!swin_.on_credit(imm.value, &why) && error_.empty()) error_ = why;
        } else if (auto seq = rwin_.on_data(imm.value, &why)) {
          recv_len_[*seq % e_->depth] = wc.byte_len;
        } else if (error_.empty()) {
          error_ = why;
        }
        break;
      }
    }
  }

 private:
  std::byte* send_at(uint64_t seq) const { return static_cast<std::byte*>(e_->mem) + (seq % e_->depth) * e_->stride; }
  std::byte* recv_at(uint32_t slot) const { return static_cast<std::byte*>(e_->mem) + (e_->depth + slot) * e_->stride; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(
        chorusRemoteError, Subsys::Transport,
        cat("ibverbs connection to rank ", peer(), " (channel ", channel(), ", ", dev_->port().device, "): ", what));
  }

  void post_send(size_t q, ibv_send_wr& wr, const char* what) {
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(e_->qps[q], &wr, &bad)) fail(cat(what, " could not be posted: ", std::strerror(err)));
    ++sq_used_[q];
  }

  // Never throws: it runs inside Device::poll for whichever connection polls. A failure is kept in error_.
  bool post_recv(size_t q) {
    ibv_recv_wr wr{};
    wr.wr_id = encode_wr_id({WrKind::Recv, static_cast<uint8_t>(q), id_, 0});
    wr.sg_list = nullptr;
    wr.num_sge = 0;  // writes with immediate land in the ring; the receive only carries the completion
    ibv_recv_wr* bad = nullptr;
    if (int err = ibv_post_recv(e_->qps[q], &wr, &bad)) {
      if (error_.empty()) error_ = cat("a receive could not be posted: ", std::strerror(err));
      return false;
    }
    return true;
  }

  // A slot is free at both ends and its queue pair has room in its send queue.
  bool can_post() const { return swin_.can_post() && sq_used_[swin_.posted() % e_->qps.size()] < e_->sq_depth; }

  // The latest credit as a zero-byte write with immediate on queue pair 0. At most depth + 2 are in flight, so
  // with the at most `depth` data writes the send queue (2 * depth + 2) never overflows; beyond that it waits,
  // and the next one carries the newer count (credits are cumulative).
  bool send_credit() {
    if (credits_in_flight_ >= e_->depth + 2 || sq_used_[0] >= e_->sq_depth) return false;
    ibv_send_wr wr{};
    wr.wr_id = encode_wr_id({WrKind::Credit, 0, id_, 0});
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    wr.imm_data = htonl(encode_imm({ImmKind::Credit, credit_}));
    wr.wr.rdma.remote_addr = remote_.ring_addr;
    wr.wr.rdma.rkey = remote_.ring_rkey;
    post_send(0, wr, "a credit");
    ++credits_in_flight_;
    credit_due_ = false;
    return true;
  }

  std::unique_ptr<Endpoint> e_;
  std::shared_ptr<Device> dev_;
  ConnData remote_;
  SendWindow swin_;
  RecvWindow rwin_;
  std::vector<uint32_t> recv_len_;  // per receive slot: bytes the write carried
  std::vector<uint32_t> sq_used_;   // per queue pair: send work requests not yet completed
  uint32_t id_ = 0;
  uint32_t credit_ = 0;
  uint64_t credits_in_flight_ = 0;
  bool credit_due_ = false;
  std::string error_;  // the first failed completion; raised when the connection can make no progress
};

bool Device::poll() {
  ibv_wc wcs[kPollBatch];
  bool any = false;
  for (;;) {
    const int n = ibv_poll_cq(cq_, kPollBatch, wcs);
    if (n <= 0) break;  // < 0 is a driver error; the connections' deadlines report the stall
    any = true;
    for (int i = 0; i < n; ++i) {
      const std::optional<WrId> id = decode_wr_id(wcs[i].wr_id);
      if (!id || id->conn >= conns_.size() || conns_[id->conn] == nullptr) continue;  // a closed connection's
      conns_[id->conn]->on_completion(wcs[i], *id);
    }
    if (n < kPollBatch) break;
  }
  return any;
}

class IbTransport : public Transport {
 public:
  IbTransport() {
    const HcaFilter filter = parse_hca_filter(param_str(Param::IbHca));
    const int gid = parse_gid_index(param_str(Param::IbGidIndex));
    const int64_t nqps = param_int(Param::IbQpsPerConnection);
    if (nqps < 1 || nqps > kMaxQpsPerConnection)
      throw Error(chorusInvalidArgument, Subsys::Transport,
                  cat("CHORUS_IB_QPS_PER_CONNECTION=", nqps, " must be between 1 and ", kMaxQpsPerConnection));
    Scan s = scan_ports(filter, gid);
    if (s.ports.empty()) {
      why_ = s.why;
      return;
    }
    try {
      dev_ = std::make_shared<Device>(s.ports.front(), static_cast<int>(nqps));
      CHORUS_INFO(Transport, "ibverbs: using %s", s.ports.front().text().c_str());
    } catch (const Error& e) {
      why_ = e.what();
    }
  }

  const char* name() const override { return "ibverbs"; }
  std::string unavailable_reason() const override { return dev_ ? std::string() : why_; }

  void describe(PeerInfo& self) const override {
    if (dev_) self.transport_caps["ibverbs"] = link_layer_name(dev_->port().link_layer);
  }

  // Both ranks have a usable port of the same link layer (InfiniBand does not talk to RoCE).
  bool can_connect(const PeerInfo& self, const PeerInfo& peer) const override {
    if (!dev_) return false;
    const auto a = self.transport_caps.find("ibverbs"), b = peer.transport_caps.find("ibverbs");
    return a != self.transport_caps.end() && b != peer.transport_caps.end() && a->second == b->second;
  }

  std::vector<std::byte> prepare(const ConnectSpec& s) override {
    auto e = make_endpoint(dev_, s.slot_bytes, s.fifo_depth);
    std::vector<std::byte> data = serialize(e->local);
    pending_[{s.peer, s.channel}] = std::move(e);
    return data;
  }

  std::unique_ptr<Connection> connect(const ConnectSpec& s, const std::vector<std::byte>& peer_data,
                                      Deadline) override {
    auto it = pending_.find({s.peer, s.channel});
    CHORUS_ASSERT(it != pending_.end());
    std::unique_ptr<Endpoint> e = std::move(it->second);
    pending_.erase(it);
    const ConnData remote = parse_conn_data(peer_data);
    const std::string differs = incompatibility(e->local, remote);
    if (!differs.empty())
      throw Error(chorusInvalidUsage, Subsys::Transport, cat("ibverbs: rank ", s.peer, " does not match: ", differs));
    return std::make_unique<IbConnection>(std::move(e), remote, s.peer, s.channel, s.slot_bytes);
  }

 private:
  std::string why_;
  std::shared_ptr<Device> dev_;
  std::map<std::pair<int, int>, std::unique_ptr<Endpoint>> pending_;
};

}  // namespace

std::unique_ptr<Transport> make_ibverbs_transport() { return std::make_unique<IbTransport>(); }

std::string ibverbs_probe(bool* available) {
  std::string out;
  try {
    const Scan s = scan_ports(parse_hca_filter(param_str(Param::IbHca)), parse_gid_index(param_str(Param::IbGidIndex)));
    *available = !s.ports.empty();
    if (s.ports.empty()) return "unavailable: " + s.why;
    for (size_t i = 0; i < s.ports.size(); ++i) out += cat(i == 0 ? "uses " : "; also ", s.ports[i].text());
    if (!s.skipped.empty()) out += cat("; skipped ", s.skipped);
  } catch (const Error& e) {
    *available = false;
    return cat("unavailable: ", e.what());
  }
  return out + "; GPUDirect RDMA (dma-buf): not supported, device buffers are staged through the host slot rings";
}

}  // namespace chorus
