// Structure-aware mutation of protobuf messages through reflection, for the fuzzers in fuzz/.
//
// A ProtoMutator changes a message one field at a time, the way a confused or hostile client
// might: it picks a field anywhere in the message tree (a top-level config field as often as a
// field of one of a thousand ops), then sets a scalar to an interesting value (0, -1, 2^31,
// 2^62, INT64_MAX, NaN, a huge string, a name from the dictionary or from elsewhere in the
// message, a string with a newline, invalid UTF-8 when allowed), perturbs it, clears it,
// creates or clears a sub-message, switches a oneof to another case, or adds, removes,
// duplicates or swaps elements of a repeated or map field. CrossOver copies a field (or a whole
// sub-message) from another message of the same type.
//
// It knows nothing of memest: the dictionary (op kinds, preset names, ...) comes from the
// caller. Everything is driven by the seed, so a mutation is reproducible. It is our own code;
// libprotobuf-mutator is not packaged in Debian 12.
#ifndef MEMEST_FUZZ_PROTO_MUTATOR_H_
#define MEMEST_FUZZ_PROTO_MUTATOR_H_

#include <google/protobuf/message.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fuzz/value_maker.h"

namespace memest::fuzz {

class ProtoMutator {
 public:
  ProtoMutator(uint64_t seed, MutatorOptions options);

  // Applies one random mutation to `message` or to a message nested in it.
  void Mutate(google::protobuf::Message* message);

  // Copies into `into` one field, or one whole sub-message, of `from` (same type as `into`),
  // at a place in the tree where both have a message of the same type. Does nothing when `from`
  // is empty.
  void CrossOver(const google::protobuf::Message& from, google::protobuf::Message* into);

  std::mt19937_64& rng() { return rng_; }

 private:
  // One field of one message of the tree: where a mutation happens.
  struct Site {
    google::protobuf::Message* message;
    const google::protobuf::FieldDescriptor* field;
  };
  struct Tree {
    std::vector<Site> sites;
    std::vector<google::protobuf::Message*> nodes;  // every message of the tree, root first
    std::vector<std::string> strings;               // every string value in the tree
  };

  void Collect(google::protobuf::Message* message, int depth, Tree* tree);
  // The tree of the message Mutate() was given, as it is now (after a change that may have
  // deleted messages a Tree collected earlier points to).
  Tree Fresh();
  const Site& PickSite(const Tree& tree);
  void MutateSite(const Site& site, const Tree& tree);
  void MutateRepeated(const Site& site, const Tree& tree);
  void MutateSingular(const Site& site, const Tree& tree);

  // Sets `field` of `message` (element `index` when repeated, appended when index < 0).
  void SetScalar(google::protobuf::Message* message, const google::protobuf::FieldDescriptor* field,
                 int index, const Tree& tree);
  // A message of the tree with `field`'s message type other than `except`, or nullptr.
  google::protobuf::Message* SameType(const Tree& tree,
                                      const google::protobuf::FieldDescriptor* field,
                                      const google::protobuf::Message* except);

  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }

  std::mt19937_64 rng_;
  MutatorOptions options_;
  ValueMaker values_;
  google::protobuf::Message* root_ = nullptr;
};

}  // namespace memest::fuzz

#endif  // MEMEST_FUZZ_PROTO_MUTATOR_H_
