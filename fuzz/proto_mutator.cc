#include "fuzz/proto_mutator.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "fuzz/field_slot.h"

namespace memest::fuzz {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kMaxDepth = 32;
constexpr size_t kMaxCollectedStrings = 4096;

// `dst` becomes a copy of `src`, safely even when one contains the other.
void CopyMessage(const Message& src, Message* dst) {
  std::unique_ptr<Message> copy(src.New());
  copy->CopyFrom(src);
  dst->CopyFrom(*copy);
}

// Moves element `from` of a repeated field to position `to`, keeping the others' order.
void MoveElement(Message* m, const FieldDescriptor* f, int from, int to) {
  const Reflection* r = m->GetReflection();
  for (; from < to; ++from) r->SwapElements(m, f, from, from + 1);
  for (; from > to; --from) r->SwapElements(m, f, from, from - 1);
}

}  // namespace

ProtoMutator::ProtoMutator(uint64_t seed, MutatorOptions options)
    : rng_(seed), options_(std::move(options)), values_(&rng_, &options_) {}

void ProtoMutator::Collect(Message* message, int depth, Tree* tree) {
  tree->nodes.push_back(message);
  const Descriptor* d = message->GetDescriptor();
  const Reflection* r = message->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    tree->sites.push_back({message, f});
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*message, f); ++k) {
          if (tree->strings.size() < kMaxCollectedStrings) {
            tree->strings.push_back(r->GetRepeatedString(*message, f, k));
          }
        }
      } else if (r->HasField(*message, f) && tree->strings.size() < kMaxCollectedStrings) {
        tree->strings.push_back(r->GetString(*message, f));
      }
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || depth >= kMaxDepth) continue;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*message, f); ++k) {
        Collect(r->MutableRepeatedMessage(message, f, k), depth + 1, tree);
      }
    } else if (r->HasField(*message, f)) {
      Collect(r->MutableMessage(message, f), depth + 1, tree);
    }
  }
}

const ProtoMutator::Site& ProtoMutator::PickSite(const Tree& tree) {
  // Half the time any site; half the time any field (of the schema) first, then one of its
  // sites, so that config.batch_size is picked as often as the thousand ops' inputs together.
  if (OneIn(2)) return tree.sites[Below(tree.sites.size())];
  std::vector<const FieldDescriptor*> fields;
  for (const Site& site : tree.sites) {
    if (std::find(fields.begin(), fields.end(), site.field) == fields.end()) {
      fields.push_back(site.field);
    }
  }
  const FieldDescriptor* field = fields[Below(fields.size())];
  std::vector<size_t> of_field;
  for (size_t i = 0; i < tree.sites.size(); ++i) {
    if (tree.sites[i].field == field) of_field.push_back(i);
  }
  return tree.sites[of_field[Below(of_field.size())]];
}

ProtoMutator::Tree ProtoMutator::Fresh() {
  Tree tree;
  Collect(root_, 0, &tree);
  return tree;
}

void ProtoMutator::Mutate(Message* message) {
  root_ = message;
  Tree tree = Fresh();
  if (tree.sites.empty()) return;
  const Site site = PickSite(tree);
  MutateSite(site, tree);
}

void ProtoMutator::MutateSite(const Site& site, const Tree& tree) {
  if (site.field->is_repeated()) {
    MutateRepeated(site, tree);
  } else {
    MutateSingular(site, tree);
  }
}

Message* ProtoMutator::SameType(const Tree& tree, const FieldDescriptor* field,
                                const Message* except) {
  std::vector<Message*> candidates;
  for (Message* node : tree.nodes) {
    if (node != except && node->GetDescriptor() == field->message_type()) {
      candidates.push_back(node);
    }
  }
  return candidates.empty() ? nullptr : candidates[Below(candidates.size())];
}

void ProtoMutator::MutateSingular(const Site& site, const Tree& tree) {
  Message* m = site.message;
  const FieldDescriptor* f = site.field;
  const Reflection* r = m->GetReflection();
  if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
    if (OneIn(8)) {
      r->ClearField(m, f);  // back to the default; for a oneof member, no case set
    } else {
      SetScalar(m, f, kSingular, tree);
    }
    return;
  }
  if (!r->HasField(*m, f)) {
    // Creating it selects this case of a oneof (deleting another case's message: the tree is
    // stale from here); give it one field so that it says something.
    Message* created = r->MutableMessage(m, f);
    const Descriptor* d = created->GetDescriptor();
    if (d->field_count() > 0 && !OneIn(4)) {
      MutateSite({created, d->field(static_cast<int>(Below(d->field_count())))}, Fresh());
    }
    return;
  }
  Message* current = r->MutableMessage(m, f);
  switch (Below(3)) {
    case 0:
      r->ClearField(m, f);
      return;
    case 1:
      if (Message* other = SameType(tree, f, current)) {
        CopyMessage(*other, current);
        return;
      }
      [[fallthrough]];
    default: {
      const Descriptor* d = current->GetDescriptor();
      if (d->field_count() == 0) return;
      MutateSite({current, d->field(static_cast<int>(Below(d->field_count())))}, tree);
    }
  }
}

void ProtoMutator::MutateRepeated(const Site& site, const Tree& tree) {
  Message* m = site.message;
  const FieldDescriptor* f = site.field;
  const Reflection* r = m->GetReflection();
  const bool is_message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
  const int n = r->FieldSize(*m, f);
  // Weights: add 3, remove 3, duplicate 2, swap 1, change one element 2, clear (1 in 48).
  size_t choice = Below(11);
  if (OneIn(48)) {
    r->ClearField(m, f);
    return;
  }
  if (n == 0) choice = 0;
  if (choice < 3) {  // add: a new element at a random place
    if (is_message) {
      Message* added = r->AddMessage(m, f);
      Message* other = OneIn(2) ? SameType(tree, f, nullptr) : nullptr;
      if (other != nullptr) {
        CopyMessage(*other, added);
      } else if (added->GetDescriptor()->field_count() > 0) {
        const Descriptor* d = added->GetDescriptor();
        MutateSite({added, d->field(static_cast<int>(Below(d->field_count())))}, Fresh());
      }
    } else {
      SetScalar(m, f, kAppend, tree);
    }
    MoveElement(m, f, n, static_cast<int>(Below(n + 1)));
  } else if (choice < 6) {  // remove one
    const int i = static_cast<int>(Below(n));
    MoveElement(m, f, i, n - 1);
    r->RemoveLast(m, f);
  } else if (choice < 8) {  // duplicate one, placed right after it
    const int i = static_cast<int>(Below(n));
    if (is_message) {
      Message* added = r->AddMessage(m, f);
      CopyMessage(r->GetRepeatedMessage(*m, f, i), added);
    } else {
      FieldSlot to(m, f, kAppend);
      CopySlot(FieldSlot(m, f, i), &to);
    }
    MoveElement(m, f, n, i + 1);
  } else if (choice < 9) {  // swap two
    r->SwapElements(m, f, static_cast<int>(Below(n)), static_cast<int>(Below(n)));
  } else {  // change one
    const int i = static_cast<int>(Below(n));
    if (!is_message) {
      SetScalar(m, f, i, tree);
      return;
    }
    Message* element = r->MutableRepeatedMessage(m, f, i);
    Message* other = SameType(tree, f, element);
    if (other != nullptr && OneIn(2)) {
      CopyMessage(*other, element);
    } else {
      element->Clear();
    }
  }
}

void ProtoMutator::SetScalar(Message* m, const FieldDescriptor* f, int index, const Tree& tree) {
  FieldSlot slot(m, f, index);
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      slot.SetInt(values_.Int(slot.GetInt(), std::numeric_limits<int32_t>::min(),
                              std::numeric_limits<int32_t>::max()));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      slot.SetInt(values_.Int(slot.GetInt(), std::numeric_limits<int64_t>::min(),
                              std::numeric_limits<int64_t>::max()));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      slot.SetUInt(values_.Unsigned(slot.GetUInt(), std::numeric_limits<uint32_t>::max()));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      slot.SetUInt(values_.Unsigned(slot.GetUInt(), std::numeric_limits<uint64_t>::max()));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      slot.SetDouble(values_.Double(slot.GetDouble()));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      slot.SetBool(index == kAppend ? OneIn(2) : !slot.GetBool());
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      slot.SetEnum(values_.Enum(f, slot.GetEnum()));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      slot.SetString(values_.String(slot.GetString(), tree.strings));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

void ProtoMutator::CrossOver(const Message& from, Message* into) {
  std::unique_ptr<Message> source(from.New());
  source->CopyFrom(from);
  Tree theirs;
  Tree ours;
  Collect(source.get(), 0, &theirs);
  Collect(into, 0, &ours);
  // Our messages with a message of the same type on their side.
  std::vector<Message*> targets;
  for (Message* node : ours.nodes) {
    for (Message* other : theirs.nodes) {
      if (other->GetDescriptor() == node->GetDescriptor()) {
        targets.push_back(node);
        break;
      }
    }
  }
  if (targets.empty()) return;
  Message* target = targets[Below(targets.size())];
  std::vector<Message*> donors;
  for (Message* other : theirs.nodes) {
    if (other->GetDescriptor() == target->GetDescriptor()) donors.push_back(other);
  }
  Message* donor = donors[Below(donors.size())];
  if (target != into && OneIn(4)) {
    target->CopyFrom(*donor);  // the whole sub-message
    return;
  }
  // One field the donor has.
  const Descriptor* d = donor->GetDescriptor();
  const Reflection* r = donor->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated() ? r->FieldSize(*donor, f) > 0 : r->HasField(*donor, f)) {
      fields.push_back(f);
    }
  }
  if (fields.empty()) return;
  const FieldDescriptor* f = fields[Below(fields.size())];
  if (!f->is_repeated()) {
    r->SwapFields(target, donor, {f});  // the donor is our copy: it may lose the field
    return;
  }
  // Append one of the donor's elements, or all of them.
  const int n = r->FieldSize(*donor, f);
  const bool all = OneIn(3);
  const int first = all ? 0 : static_cast<int>(Below(n));
  const int last = all ? n : first + 1;
  for (int i = first; i < last; ++i) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      r->AddMessage(target, f)->CopyFrom(r->GetRepeatedMessage(*donor, f, i));
    } else {
      FieldSlot to(target, f, kAppend);
      CopySlot(FieldSlot(donor, f, i), &to);
    }
  }
}

}  // namespace memest::fuzz
