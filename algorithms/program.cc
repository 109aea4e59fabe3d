#include "algorithms/program.h"

#include <sstream>

namespace chorus::algo {

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::AllReduce: return "AllReduce";
    case Coll::AllGather: return "AllGather";
    case Coll::ReduceScatter: return "ReduceScatter";
    case Coll::Broadcast: return "Broadcast";
    case Coll::Reduce: return "Reduce";
    case Coll::AllToAll: return "AllToAll";
    case Coll::AllToAllv: return "AllToAllv";
    case Coll::SendRecv: return "SendRecv";
    case Coll::Barrier: return "Barrier";
    case Coll::Gather: return "Gather";
    case Coll::Scatter: return "Scatter";
    case Coll::Count: break;
  }
  return "?";
}

const char* opcode_name(OpCode op) {
  switch (op) {
    case OpCode::Send: return "send";
    case OpCode::Recv: return "recv";
    case OpCode::RecvReduce: return "recv_reduce";
    case OpCode::RecvReduceSend: return "recv_reduce_send";
    case OpCode::RecvReduceCopySend: return "recv_reduce_copy_send";
    case OpCode::RecvCopySend: return "recv_copy_send";
    case OpCode::Copy: return "copy";
    case OpCode::Reduce: return "reduce";
  }
  return "?";
}

namespace {
const char* buf_name(BufKind b) {
  switch (b) {
    case BufKind::Input: return "in";
    case BufKind::Output: return "out";
    case BufKind::Scratch: return "scratch";
  }
  return "?";
}
// "in[3]", or "in[4..7]" for a run of chunks.
std::string chunk_name(const ChunkRef& c) {
  std::ostringstream os;
  os << buf_name(c.buf) << "[" << c.chunk;
  if (c.count != 1) os << ".." << c.chunk + c.count - 1;
  os << "]";
  return os.str();
}
}  // namespace

std::string to_string(const RankProgram& p) {
  std::ostringstream os;
  for (size_t l = 0; l < p.lanes.size(); ++l) {
    os << "lane " << l << " (channel " << p.lanes[l].channel << "):\n";
    for (const Step& s : p.lanes[l].steps) {
      if (s.fence) os << "  -- fence\n";
      os << "  " << opcode_name(s.op);
      if (op_receives(s.op)) os << " from " << s.recv_peer;
      if (op_sends(s.op)) os << " to " << s.send_peer;
      if (op_reads_src(s.op)) os << " src=" << chunk_name(s.src);
      if (op_writes_dst(s.op)) os << " dst=" << chunk_name(s.dst);
      if (s.final) os << " final";
      os << "\n";
    }
  }
  return os.str();
}

BlockShape call_blocks(Coll coll, BufKind buf, size_t count, int nranks, const RankProgram& program) {
  if (buf == BufKind::Scratch) return {program.scratch.nblocks, count};
  const bool input = buf == BufKind::Input;
  switch (coll) {
    case Coll::AllReduce:
    case Coll::Barrier:
    case Coll::Broadcast:
    case Coll::Reduce: return {1, count};
    case Coll::AllGather:
    case Coll::Gather: return {input ? 1 : nranks, count};
    case Coll::ReduceScatter:
    case Coll::Scatter: return {input ? nranks : 1, count};
    case Coll::AllToAll:
    case Coll::AllToAllv: return {nranks, count};
    case Coll::SendRecv:
    case Coll::Count: break;
  }
  return {0, 0};
}

}  // namespace chorus::algo
