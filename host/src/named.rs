//! Enums stored and served by name (`named_enum!`): each variant has one lowercase name, the
//! same in the database, the API and messages, with `as_str`, `Display`, `FromStr` (refusing
//! unknown names with [`UnknownName`]) and serde.

/// A stored enum value that is not one of the known names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{value}`")]
pub struct UnknownName {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident ($kind:literal) { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize, ::utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name stored in the database and used in the API.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::named::UnknownName;
            fn from_str(s: &str) -> Result<$name, $crate::named::UnknownName> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::named::UnknownName { kind: $kind, value: s.chars().take(100).collect() }),
                }
            }
        }
    };
}

pub(crate) use named_enum;
