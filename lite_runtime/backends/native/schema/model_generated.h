// Stand-in for the flatc-generated schema/model_generated.h that include/api/kernel.h includes and the
// mindspore_lite 2.0 wheel does not ship. Only what kernel.h needs: an opaque Primitive and the two enums
// with their flatbuffers underlying types (PrimitiveType is a union tag: uint8_t; QuantType: int).
#pragma once
#include <cstdint>
namespace mindspore {
namespace schema {
struct Primitive;
enum PrimitiveType : uint8_t { PrimitiveType_NONE = 0 };
enum QuantType : int32_t { QuantType_QUANT_NONE = 0 };
}  // namespace schema
}  // namespace mindspore
