// config.lora from the proto (server/convert.h).
#include <string>

#include "server/convert.h"

namespace memest {

StatusOr<LoraConfig> LoraFromProto(const v1::Lora& lora) {
  if (lora.rank() == 0) {
    return InvalidArgument("config.lora.rank: required when config.lora is set (1 to " +
                           std::to_string(kMaxLoraRank) + ")");
  }
  LoraConfig out;
  out.rank = lora.rank();
  if (lora.has_alpha()) out.alpha = lora.alpha();
  out.dropout = lora.dropout();
  out.target_modules.assign(lora.target_modules().begin(), lora.target_modules().end());
  out.modules_to_save.assign(lora.modules_to_save().begin(), lora.modules_to_save().end());
  out.autocast_adapter_dtype = !lora.keep_adapter_dtype();
  return out;
}

}  // namespace memest
