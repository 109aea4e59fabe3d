#include "trainer/dist.h"

#include <stdexcept>
#include <string>

namespace trainer {

Dist::Dist(chorus::Comm& world, int shard_group) : world_(&world), rank_(world.rank()), nranks_(world.size()) {
  shard_size_ = shard_group <= 0 ? nranks_ : shard_group;
  if (nranks_ % shard_size_ != 0)
    throw std::invalid_argument("shard group of " + std::to_string(shard_size_) + " ranks does not divide " +
                                std::to_string(nranks_) + " ranks");
  // Every rank takes part in every split, in the same order.
  shard_ = std::make_unique<chorus::Comm>(world.split(rank_ / shard_size_, rank_));
  if (shard_size_ < nranks_) replica_ = std::make_unique<chorus::Comm>(world.split(rank_ % shard_size_, rank_));
  experts_ = std::make_unique<chorus::Comm>(world.split(0, rank_));
  shard_rank_ = shard_->rank();
}

}  // namespace trainer
